"""The floors: a Flask app that only parses the review and answers allowed, served three
ways. Our HTTPS figures are reported as ratios to them, measured in the same run.

- ``new``: served exactly like the webhook (``retry-webhook serve``'s supervisor, granian
  workers, TLS and settings, and its reviews answered in front of Flask as the webhook's
  are, ``webhook.serving.app.AdmissionDispatch``; only the answer differs): what the
  policy costs on our server;
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
from typing import Any

from flask import Flask, Response, request

from webhook.admission import review as admission
from webhook.admission.review import Verdict
from webhook.serving.app import AdmissionDispatch, _content_length, read_body


def allow(environ: dict[str, Any]) -> tuple[int, bytes]:
    """The review read from the environ as the webhook reads it, and answered allowed."""
    review = admission.decode(read_body(environ, _content_length(environ)))
    return 200, admission.encode_bytes(review.uid, Verdict())


def create_floor_app(dispatch: bool = False) -> Flask:
    """The allow-all app; ``dispatch``: its reviews answered in front of Flask, as the
    webhook's are (the floor on our server), else by a Flask view (as a user would write
    it, for gunicorn and granian's WSGI interface)."""
    app = Flask("floor")

    @app.post("/mutate")
    def mutate() -> Response:
        review = admission.decode(request.get_data(cache=False))
        return Response(admission.encode_bytes(review.uid, Verdict()), mimetype="application/json")

    @app.get("/healthz")
    def healthz() -> Response:
        return Response(b'{"status":"ok"}', mimetype="application/json")

    if dispatch:
        app.wsgi_app = AdmissionDispatch(  # type: ignore[method-assign]
            app.wsgi_app, {"/mutate": allow}, _failed, app.logger
        )
    return app


def _failed(path: str) -> tuple[int, bytes]:
    return 500, b'{"error":"InternalServerError"}'


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
    serve(options, app_factory=lambda _runtime: create_floor_app(dispatch=True))


if __name__ == "__main__":
    main()
