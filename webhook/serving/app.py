"""The Flask application: HTTP in, AdmissionReview out.

Handlers are thin: check the HTTP envelope, decode the review, call the engine, encode.
Every failure answers with a reason and a 4xx status (413 for bodies over the limit,
before they are read); nothing a client sends produces a 500 or a traceback. A bug
in the engine after decoding still yields a well-formed review (allowed, with a
warning), because a webhook that errors blocks or silently skips the whole cluster.

The reviews themselves (``POST /mutate`` and ``/validate``) are answered by
``AdmissionDispatch`` in front of Flask, from the WSGI environ: Flask's request context,
URL adapter and response object cost more than decoding a Job's review (a third of a
served request that the memo answers, ``docs/PERFORMANCE.md``), and a review needs
none of them. Everything else (``/healthz``, ``/readyz``, errors, other methods) is
Flask's, and a review answered either way is the same bytes and headers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, InternalServerError
from werkzeug.http import HTTP_STATUS_CODES

from webhook.admission import engine
from webhook.admission import review as codec
from webhook.admission.review import ReviewError, Verdict
from webhook.cluster.events import Event, EventSink, NoEvents, decision_type
from webhook.cluster.facts import ClusterFacts, NoCluster
from webhook.cluster.leadership import LeaderNote, NoLeader
from webhook.cluster.runtimes import NoRuntimes, RuntimeSource
from webhook.cluster.version import UnknownVersion, VersionSource
from webhook.kinds.registry import WORKLOADS, lookup
from webhook.policy.config import Config
from webhook.serving import logs
from webhook.serving.metrics import Metrics

log = logging.getLogger("webhook.admission")
_DECISIONS = logs.DecisionLog("webhook.admission")

#: The API server caps stored objects at about 3 MiB; a review carries object and
#: oldObject plus envelope, so anything over this is not a real review.
MAX_BODY_BYTES = 7 * 1024 * 1024
TOO_LARGE = f"request body over {MAX_BODY_BYTES} bytes: not an AdmissionReview"


#: Admission endpoints, as metric labels.
ENDPOINTS = {"/mutate": "mutate", "/validate": "validate"}


@dataclass
class State:
    """What handlers read per request. ``config`` is replaced whole on reload (one
    attribute assignment, atomic under the GIL), never edited in place.

    ``readiness`` answers /readyz: ready or not, and details (the server's is
    ``WorkerRuntime.readiness``). ``metrics`` is None where nothing records (dry runs,
    tests of the app alone)."""

    config: Config = field(default_factory=Config)
    attempts: ClusterFacts = field(default_factory=NoCluster)
    runtimes: RuntimeSource = field(default_factory=NoRuntimes)
    version: VersionSource = field(default_factory=UnknownVersion)
    readiness: Callable[[], tuple[bool, dict[str, Any]]] = lambda: (True, {})
    metrics: Metrics | None = None
    #: Whether a controller leads (``webhook.cluster.leadership``), as this replica sees it.
    leadership: LeaderNote | NoLeader = field(default_factory=NoLeader)
    #: Where the decisions that shape new pods go, as Events (``webhook.cluster.events``).
    events: EventSink = field(default_factory=NoEvents)
    #: Marks the pods disruptors delete (``webhook.cluster.deletions``); ``None``: no cluster.
    deletions: Any = None


_JSON = "application/json"


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status, mimetype=_JSON)


def create_app(state: State | None = None) -> Flask:
    state = state or State()
    app = Flask("retry-policy-webhook")
    # The admission handlers enforce the limit themselves (``read_body``); this is the
    # backstop for anything that reads ``request.data`` through werkzeug.
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions["retry_policy_state"] = state
    reviews = Reviews(state)

    # Reached through Flask only when the dispatch in front of it passes a review on (a
    # method not spelled in capitals, which werkzeug reads as POST too).
    @app.post("/mutate")
    def mutate() -> Response:
        return _response(*reviews.mutate(request.environ))

    @app.post("/validate")
    def validate() -> Response:
        return _response(*reviews.validate(request.environ))

    @app.get("/healthz")
    def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        ready, details = state.readiness()
        body = {
            "status": "ready" if ready else "not ready",
            "config": state.config.source,
            "attemptCache": state.attempts.stats(),
            "runtimeCache": state.runtimes.stats(),
            "memo": engine.MEMO.stats(),
            "kubernetesVersion": _version_stats(state),
            **details,
        }
        return _json(body, 200 if ready else 503)

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException) -> Response:
        endpoint = ENDPOINTS.get(request.path)
        if endpoint is not None and request.method == "POST":
            reviews.observe(endpoint, "unknown", "bad_request")
        return _json(
            {"error": err.name.replace(" ", ""), "reason": err.description}, err.code or 400
        )

    app.wsgi_app = AdmissionDispatch(  # type: ignore[method-assign]
        app.wsgi_app,
        {"/mutate": reviews.mutate, "/validate": reviews.validate},
        reviews.failed,
        logging.getLogger(app.name),
    )
    return app


class Reviews:
    """The answers to ``/mutate`` and ``/validate``: from a WSGI environ, the HTTP status
    and the JSON body (``AdmissionDispatch`` and Flask's views serve them alike)."""

    def __init__(self, state: State):
        self.state = state

    def mutate(self, environ: dict[str, Any]) -> tuple[int, bytes]:
        return self.handle("mutate", self._mutate, environ)

    def validate(self, environ: dict[str, Any]) -> tuple[int, bytes]:
        return self.handle("validate", self._validate, environ)

    def _mutate(self, review: codec.Request) -> Verdict:
        state = self.state
        return engine.mutate(
            review, state.config, state.attempts, state.runtimes, state.version, state.leadership
        )

    def _validate(self, review: codec.Request) -> Verdict:
        state = self.state
        return engine.validate(review, state.config, state.runtimes, state.version)

    def observe(self, endpoint: str, kind: str, outcome: str, started: float | None = None) -> None:
        if self.state.metrics is not None:
            # No start time: refused by werkzeug before the handler ran.
            started = started or time.perf_counter()
            self.state.metrics.observe_admission(
                endpoint, kind, outcome, time.perf_counter() - started
            )

    def refuse(
        self,
        endpoint: str,
        reason: str,
        started: float,
        status: int = 400,
        error: str = "BadRequest",
    ) -> tuple[int, bytes]:
        """A request that is not a review we can read: counted, and answered with why."""
        self.observe(endpoint, "unknown", "bad_request", started)
        return status, orjson.dumps({"error": error, "reason": reason})

    def failed(self, path: str) -> tuple[int, bytes]:
        """What Flask answers when a view raises: its 500, through ``http_error``."""
        self.observe(ENDPOINTS[path], "unknown", "bad_request")
        error = InternalServerError()
        return 500, orjson.dumps(
            {"error": error.name.replace(" ", ""), "reason": error.description}
        )

    def handle(
        self, endpoint: str, decide: Callable[[codec.Request], Verdict], environ: dict[str, Any]
    ) -> tuple[int, bytes]:
        """The HTTP status and JSON body of the answer to one review."""
        started = time.perf_counter()  # before the body is read: it counts too
        refuse = self.refuse
        # The envelope is read from the WSGI environ itself: werkzeug's header and length
        # accessors cost more than the rest of the envelope's checks together.
        if not _is_json(environ.get("CONTENT_TYPE", "")):
            return refuse(endpoint, "Content-Type must be application/json", started)
        length = _content_length(environ)
        # A Content-Length over the limit is refused before anything is read.
        if (length or 0) > MAX_BODY_BYTES:
            return refuse(endpoint, TOO_LARGE, started, 413, "RequestEntityTooLarge")
        try:
            body = read_body(environ, length)
        except (OSError, ValueError):
            # The client stopped sending mid-body (dropped by the server's read timeout)
            # or went away: nobody is left to read an answer, but it is not our error.
            return refuse(endpoint, "request body not received", started, 408, "RequestTimeout")
        if len(body) > MAX_BODY_BYTES:  # chunked: read_body stops one byte past the limit
            return refuse(endpoint, TOO_LARGE, started, 413, "RequestEntityTooLarge")
        if length is not None and len(body) < length:
            return refuse(endpoint, "request body shorter than its Content-Length", started)
        try:
            review = codec.decode(body)
        except ReviewError as err:
            return refuse(endpoint, str(err), started)
        return 200, self._answer(endpoint, decide, review, started)

    def _answer(
        self,
        endpoint: str,
        decide: Callable[[codec.Request], Verdict],
        review: codec.Request,
        started: float,
    ) -> bytes:
        state = self.state
        errored = False
        try:
            verdict = decide(review)
        except Exception:
            errored = True
            log.exception("unexpected error", extra={"uid": review.uid, "endpoint": endpoint})
            verdict = Verdict(warnings=["retry-policy: internal error; request admitted unchanged"])
        outcome = "error" if errored else _outcome(verdict)
        if verdict.deleted is not None and not review.dry_run and state.deletions is not None:
            state.deletions.submit(verdict.deleted)  # (only queued: never waits)
        try:
            _log_decision(endpoint, review, verdict, outcome, started)
        except Exception:  # a logging fault must never fail an admission
            log.exception("could not log decision")
        if endpoint == "mutate" and verdict.decisions:
            try:
                emit_decisions(state.events, review, verdict)
            except Exception:  # nor an Event: it is only queued here, never written
                log.exception("could not queue events")
        answer = codec.encode_bytes(review.uid, verdict)
        if state.metrics is not None:
            try:
                kind = _kind_label(review)
                _count(state.metrics, endpoint, kind, review, verdict, outcome)
                self.observe(endpoint, kind, outcome, started)
            except Exception:  # nor a metrics fault
                log.exception("could not record metrics")
        return answer


#: The status lines werkzeug writes (``Response.status``), for the codes reviews answer.
_STATUS_LINES = {code: f"{code} {HTTP_STATUS_CODES[code].upper()}" for code in HTTP_STATUS_CODES}


def _response(status: int, body: bytes) -> Response:
    return Response(body, status, mimetype=_JSON)


class AdmissionDispatch:
    """WSGI middleware: a ``POST`` to one of ``answers``' paths is answered by its
    function (``environ -> (status, JSON body)``) without Flask; every other request goes
    on to ``app``. The answer has the headers Flask's ``Response`` would give it
    (``Content-Type: application/json`` and ``Content-Length``), and a function that
    raises gets what Flask answers a view that raises: the error logged on the app's
    logger as Flask logs it, and ``failed(path)`` (a 500)."""

    def __init__(
        self,
        app: Callable[..., Any],
        answers: dict[str, Callable[[dict[str, Any]], tuple[int, bytes]]],
        failed: Callable[[str], tuple[int, bytes]],
        logger: logging.Logger,
    ):
        self.app = app
        self.answers = answers
        self.failed = failed
        self.logger = logger

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        answer = (
            self.answers.get(environ.get("PATH_INFO", ""))
            if environ.get("REQUEST_METHOD") == "POST"
            else None
        )
        if answer is None:
            return self.app(environ, start_response)
        try:
            status, body = answer(environ)
        except Exception:
            path = environ["PATH_INFO"]
            self.logger.error("Exception on %s [POST]", path, exc_info=True)
            status, body = self.failed(path)
        start_response(
            _STATUS_LINES[status], [("Content-Type", _JSON), ("Content-Length", str(len(body)))]
        )
        return [body]


def _is_json(content_type: str) -> bool:
    return (
        content_type == "application/json"
        or content_type.partition(";")[0].strip().lower() == "application/json"
    )


def _content_length(environ: dict[str, Any]) -> int | None:
    """The request's Content-Length as werkzeug reads it: None when there is none, 0 when
    it is not a whole number (nothing is read then)."""
    value = environ.get("CONTENT_LENGTH")
    if value is None:
        return None
    value = value.strip()
    return int(value) if value.isascii() and value.isdigit() else 0


def read_body(environ: dict[str, Any], length: int | None) -> bytes:
    """The request body, read straight from the WSGI server's input stream.

    Not through werkzeug's guarded stream (``request.get_data`` with a
    ``MAX_CONTENT_LENGTH``): that reads in Python-level 64 KiB steps until it sees the
    end, one more read than the body needs, a measurable share of a small request.
    Reading exactly ``Content-Length`` bytes never reads past the body. A body without
    one (chunked) is read only from a server that ends the stream at the body's end
    (``wsgi.input_terminated``, as ours does: ``webhook/serving/rsgi.py``), and one byte past
    the limit at most, so the caller can tell it is too large; from any other server it
    reads as empty, which is what werkzeug answers there too."""
    stream = environ["wsgi.input"]
    if length is not None:
        return stream.read(length)
    if environ.get("wsgi.input_terminated"):
        return stream.read(MAX_BODY_BYTES + 1)
    return b""


def _outcome(verdict: Verdict) -> str:
    if not verdict.allowed:
        return "denied"
    return "patched" if verdict.patch else "allowed"


def _version_stats(state: State) -> dict[str, Any]:
    """The version the policy uses, and where it came from (a config pin wins)."""
    if state.config.kubernetes_version is not None:
        return {"source": "config", "version": str(state.config.kubernetes_version)}
    return state.version.stats()


def _kind_label(review: codec.Request) -> str:
    """A bounded label: kinds we handle by name, every other kind as ``other``."""
    kind = review.kind
    return kind.kind if lookup(kind.group, kind.version, kind.kind) is not None else "other"


def denial_reasons(verdict: Verdict) -> Iterable[str]:
    """``Problem.reason`` slugs of a denial's problems, else the status reason."""
    problems = verdict.problems
    if problems:
        return [p.reason for p in problems]
    return [verdict.reason or "denied"]


def _count(
    recorder: Metrics,
    endpoint: str,
    kind: str,
    review: codec.Request,
    verdict: Verdict,
    outcome: str,
) -> None:
    if outcome == "patched" and endpoint == "mutate":
        recorder.count_mutation(kind, verdict.annotations)
        if verdict.actions:
            recorder.count_retry_actions(verdict.actions)
    elif outcome == "denied":
        recorder.count_denial(endpoint, kind, denial_reasons(verdict))


def emit_decisions(events: EventSink, review: codec.Request, verdict: Verdict) -> int:
    """Queue an Event for each decision of an allowed mutation (none for a dry run: the
    pod is not created), regarding the workload the pod belongs to; how many were
    queued. Never waits: the recorder's thread writes them."""
    if review.dry_run or not verdict.allowed or not verdict.decisions:
        return 0
    if review.kind.kind != "Pod" or review.kind.group or review.object is None:
        return 0
    regarding = WORKLOADS.of_pod(review.object.get("metadata"), review.namespace)
    if regarding is None:
        return 0
    return sum(
        events.emit(Event(regarding, decision_type(reason), reason, note))
        for reason, note in verdict.decisions
    )


def _log_decision(
    endpoint: str, review: codec.Request, verdict: Verdict, outcome: str, started: float
) -> None:
    """One line per decision: identifiers and outcome only, never object contents (of a
    pod changed by failure-aware retries, what they did, as counts: ``retry_actions``)."""
    _DECISIONS.write(
        {
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
            **({"retry_actions": dict(verdict.actions)} if verdict.actions else {}),
        }
    )
