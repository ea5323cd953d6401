"""The floor: a server that only parses the review and answers allowed, served exactly
like the webhook (same gunicorn application class, worker type, TLS context and
settings). Our HTTPS figures are reported as ratios to it, measured in the same run.

``python -m benchmarks.floor --cert-dir D --port N [--workers W --threads T]``
"""

from __future__ import annotations

import argparse

from flask import Flask, Response, request

from webhook import admission, certs
from webhook.admission import Verdict
from webhook.config import Config
from webhook.server import ServeOptions, TlsContexts, WebhookApplication


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


class FloorApplication(WebhookApplication):
    def load(self):
        return create_floor_app()


def main() -> None:
    parser = argparse.ArgumentParser()
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
    )
    paths, _ = certs.ensure(args.cert_dir, options.service, options.namespace)
    FloorApplication(options, TlsContexts(paths.cert, paths.key), Config()).run()


if __name__ == "__main__":
    main()
