"""The floors: a Flask app that only parses the review and answers allowed, served three
ways. Our HTTPS figures are reported as ratios to them, measured in the same run.

- ``new``: served exactly like the webhook (``retry-webhook serve``'s supervisor, granian
  workers, TLS and settings; only the app differs): what the policy costs on our server;
- ``gunicorn``: under gunicorn gthread with its own TLS, the way a user would hand-write a
  Flask webhook (``gunicorn --workers 2 --threads 8 --certfile ... --keyfile ...``);
- ``granian-wsgi``: under granian's own WSGI interface (``granian --interface wsgi``),
  hand-written the same way: what our serving layer costs against granian's.

``python -m benchmarks.floor --server new --cert-dir D --port N [--workers W --threads T]``
(``gunicorn`` and ``granian-wsgi`` are started by ``benchmarks.https`` with their own
command lines, on ``benchmarks.floor:app``).
"""

from __future__ import annotations

import argparse

from flask import Flask, Response, request

from webhook.admission import review as admission
from webhook.admission.review import Verdict


def create_floor_app() -> Flask:
    app = Flask("floor")

    @app.post("/mutate")
    def mutate() -> Response:
        review = admission.decode(request.get_data(cache=False))
        return Response(admission.encode_bytes(review.uid, Verdict()), mimetype="application/json")

    @app.get("/healthz")
    def healthz() -> Response:
        return Response(b'{"status":"ok"}', mimetype="application/json")

    return app


#: For servers started on a module path (gunicorn, granian).
app = create_floor_app()


def main() -> None:
    from webhook.serving.options import ServeOptions
    from webhook.serving.server import serve

    parser = argparse.ArgumentParser()
    parser.add_argument("--server", choices=["new"], default="new")
    parser.add_argument("--cert-dir", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=ServeOptions.workers)
    parser.add_argument("--threads", type=int, default=ServeOptions.threads)
    args = parser.parse_args()
    options = ServeOptions(
        cert_dir=args.cert_dir,
        host="127.0.0.1",
        port=args.port,
        workers=args.workers,
        threads=args.threads,
        kube="off",
        log_level="warning",
        metrics_port=0,
    )
    serve(options, app_factory=lambda _runtime: create_floor_app())


if __name__ == "__main__":
    main()
