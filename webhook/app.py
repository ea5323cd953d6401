"""The Flask application: HTTP in, AdmissionReview out.

Handlers are thin: check the HTTP envelope, decode the review, call the engine, encode.
Every failure answers with a reason and a 4xx status (413 for bodies over the limit,
before they are read); nothing a client sends produces a 500 or a traceback. A bug
in the engine after decoding still yields a well-formed review (allowed, with a
warning), because a webhook that errors blocks or silently skips the whole cluster.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from webhook import admission, engine
from webhook.admission import ReviewError, Verdict
from webhook.attempts import AttemptSource, NoCluster
from webhook.config import Config

log = logging.getLogger("webhook.admission")

#: The API server caps stored objects at about 3 MiB; a review carries object and
#: oldObject plus envelope, so anything over this is not a real review.
MAX_BODY_BYTES = 7 * 1024 * 1024


@dataclass
class State:
    """What handlers read per request. ``config`` is replaced whole on reload (one
    attribute assignment, atomic under the GIL), never edited in place."""

    config: Config = field(default_factory=Config)
    attempts: AttemptSource = field(default_factory=NoCluster)
    ready: Callable[[], bool] = lambda: True


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body, separators=(",", ":")), status, mimetype="application/json")


def create_app(state: State | None = None) -> Flask:
    state = state or State()
    app = Flask("retry-policy-webhook")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions["retry_policy_state"] = state

    def handle(endpoint: str, decide: Callable[[admission.Request], Verdict]) -> Response:
        started = time.perf_counter()
        if request.mimetype != "application/json":
            return _json(
                {"error": "BadRequest", "reason": "Content-Type must be application/json"}, 400
            )
        body = request.get_data(cache=False)
        try:
            review = admission.decode(body)
        except ReviewError as err:
            return _json({"error": "BadRequest", "reason": str(err)}, 400)
        try:
            verdict = decide(review)
        except Exception:
            log.exception("unexpected error", extra={"uid": review.uid, "endpoint": endpoint})
            verdict = Verdict(warnings=["retry-policy: internal error; request admitted unchanged"])
        try:
            _log_decision(endpoint, review, verdict, started)
        except Exception:  # a logging fault must never fail an admission
            log.exception("could not log decision")
        return _json(admission.encode(review.uid, verdict))

    @app.post("/mutate")
    def mutate() -> Response:
        return handle("mutate", lambda r: engine.mutate(r, state.config, state.attempts))

    @app.post("/validate")
    def validate() -> Response:
        return handle("validate", lambda r: engine.validate(r, state.config))

    @app.get("/healthz")
    def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        ready = state.ready()
        body = {
            "status": "ready" if ready else "not ready",
            "config": state.config.source,
            "attemptCache": state.attempts.stats(),
        }
        return _json(body, 200 if ready else 503)

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException) -> Response:
        return _json(
            {"error": err.name.replace(" ", ""), "reason": err.description}, err.code or 400
        )

    return app


def _log_decision(
    endpoint: str, review: admission.Request, verdict: Verdict, started: float
) -> None:
    """One line per decision: identifiers and outcome only, never object contents."""
    if not verdict.allowed:
        outcome = "denied"
    elif verdict.patch:
        outcome = "patched"
    else:
        outcome = "allowed"
    log.info(
        "admission decision",
        extra={
            "endpoint": endpoint,
            "uid": review.uid,
            "kind": review.kind.kind,
            "operation": review.operation,
            "namespace": review.namespace,
            "object_name": review.name,
            "outcome": outcome,
            "reason": verdict.reason or None,
            "dry_run": review.dry_run,
            "warnings": len(verdict.warnings),
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
        },
    )
