"""The WSGI app behind granian's RSGI interface (``webhook/serving/rsgi.py``), driven in-process
with the RSGI calls granian makes, so that each way a body can go wrong is exercised
exactly: not read when over the limit, read only up to one byte past it without a
length, cut off by the body timeout, or lost with its client. (The real server, with
granian, runs the same paths in tests/serving/test_server.py and
tests/serving/test_slowclients.py.)"""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from testkit.builders import FULL, job, review
from webhook.cluster.attempts import AttemptLookup
from webhook.cluster.facts import NoCluster
from webhook.serving.app import MAX_BODY_BYTES, TOO_LARGE, State, create_app
from webhook.serving.rsgi import NeedsThread, WsgiOverRsgi

BODY = json.dumps(review(job(FULL))).encode()


class Headers:
    def __init__(self, pairs: list[tuple[str, str]]):
        self.pairs = pairs

    def items(self) -> list[tuple[str, str]]:
        return list(self.pairs)


@dataclass
class Scope:
    headers: Headers
    method: str = "POST"
    path: str = "/mutate"
    query_string: str = ""
    proto: str = "http"
    http_version: str = "1.1"
    server: str = "127.0.0.1:8443"
    client: str = "10.0.0.7:51234"


@dataclass
class Proto:
    """granian's HTTP protocol object: the body (whole, in chunks, never, or failing)
    and the one response."""

    chunks: list[bytes] = field(default_factory=list)
    stall: bool = False  # the body never comes
    gone: bool = False  # the client goes away mid-body
    reads: int = 0
    sent: tuple[int, list[tuple[str, str]], bytes] | None = None

    async def __call__(self) -> bytes:
        self.reads += 1
        await self._wait()
        return b"".join(self.chunks)

    async def _wait(self) -> None:
        if self.stall:
            await asyncio.sleep(3600)
        if self.gone:
            raise ConnectionResetError("client went away")

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        self.reads += 1
        for chunk in self.chunks:
            yield chunk
        await self._wait()

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        assert self.sent is None, "answered twice"
        self.sent = (status, headers, body)


def serve(adapter: WsgiOverRsgi, scope: Scope, proto: Proto) -> tuple[int, dict, dict]:
    asyncio.run(adapter.__rsgi__(scope, proto))
    assert proto.sent is not None
    status, headers, body = proto.sent
    return status, dict(headers), json.loads(body)


def adapter(**kwargs) -> WsgiOverRsgi:
    return WsgiOverRsgi(create_app(), MAX_BODY_BYTES, kwargs.pop("body_timeout", 5.0), **kwargs)


def scope_with(*headers: tuple[str, str], path: str = "/mutate") -> Scope:
    base = [("host", "localhost"), ("content-type", "application/json")]
    return Scope(Headers(base + list(headers)), path=path)


def test_a_review_is_read_and_answered_on_a_kept_alive_connection():
    proto = Proto([BODY[:100], BODY[100:]])
    status, headers, answer = serve(
        adapter(), scope_with(("content-length", str(len(BODY)))), proto
    )
    assert status == 200 and answer["response"]["allowed"] is True
    assert "connection" not in headers  # kept alive


def test_a_length_over_the_limit_is_refused_without_reading_and_closes():
    proto = Proto([b"x" * 10])
    size = str(MAX_BODY_BYTES + 1)
    status, headers, answer = serve(adapter(), scope_with(("content-length", size)), proto)
    assert status == 413 and answer == {"error": "RequestEntityTooLarge", "reason": TOO_LARGE}
    assert proto.reads == 0  # not a byte read
    assert headers["connection"] == "close"  # the rest of it is never read either


def test_a_chunked_body_is_read_only_to_one_byte_past_the_limit():
    part = b"x" * (1 << 20)
    proto = Proto([part] * 9)  # 9 MiB, over the 7 MiB limit
    status, headers, answer = serve(adapter(), scope_with(("transfer-encoding", "chunked")), proto)
    assert status == 413 and answer["error"] == "RequestEntityTooLarge"
    assert headers["connection"] == "close"


def test_a_chunked_review_within_the_limit_is_answered():
    proto = Proto([BODY[i : i + 700] for i in range(0, len(BODY), 700)])
    status, headers, answer = serve(adapter(), scope_with(("transfer-encoding", "chunked")), proto)
    assert status == 200 and answer["response"]["allowed"] is True
    assert "connection" not in headers


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_that_does_not_arrive_in_time_gets_408_and_closes(chunked):
    framing = ("transfer-encoding", "chunked") if chunked else ("content-length", "5000")
    proto = Proto([b'{"apiVersion"'], stall=True)
    status, headers, answer = serve(adapter(body_timeout=0.2), scope_with(framing), proto)
    assert status == 408
    assert answer == {"error": "RequestTimeout", "reason": "request body not received"}
    assert headers["connection"] == "close"


def test_a_client_gone_mid_body_is_a_408_not_a_500():
    proto = Proto([b'{"apiV'], gone=True)
    status, headers, _ = serve(adapter(), scope_with(("content-length", "5000")), proto)
    assert status == 408 and headers["connection"] == "close"


def test_a_stopping_worker_is_not_mistaken_for_a_timeout():
    """A cancellation that is not the body timeout (the worker stopping) propagates."""

    async def main():
        proto = Proto([b"{"], stall=True)
        task = asyncio.ensure_future(
            adapter().__rsgi__(scope_with(("content-length", "50")), proto)
        )
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert proto.sent is None

    asyncio.run(main())


def test_a_draining_worker_closes_each_connection_after_its_answer():
    served = adapter()
    served.draining = True
    status, headers, _ = serve(
        served, scope_with(("content-length", str(len(BODY)))), Proto([BODY])
    )
    assert status == 200 and headers["connection"] == "close"
    scope = scope_with(path="/healthz")
    scope.method = "GET"
    status, headers, _ = serve(served, scope, Proto())
    assert status == 200 and headers["connection"] == "close"


def test_the_wsgi_environ_carries_the_request():
    seen: dict = {}

    def app(environ, start_response):
        seen.update(environ)
        seen["body"] = environ["wsgi.input"].read()
        start_response("204 No Content", [("x-ok", "1")])
        return [b""]

    scope = Scope(
        Headers(
            [
                ("host", "example"),
                ("x-multi", "a"),
                ("x-multi", "b"),
                ("content-type", "application/json"),
                ("content-length", "2"),
            ]
        ),
        path="/a%20b",
        query_string="q=1",
        client="[::1]:4000",
    )
    served = WsgiOverRsgi(app, MAX_BODY_BYTES, 5.0)
    asyncio.run(served.__rsgi__(scope, Proto([b"{}"])))
    assert seen["PATH_INFO"] == "/a b" and seen["QUERY_STRING"] == "q=1"
    assert seen["HTTP_X_MULTI"] == "a,b" and seen["HTTP_HOST"] == "example"
    assert seen["CONTENT_TYPE"] == "application/json" and seen["CONTENT_LENGTH"] == "2"
    assert seen["REMOTE_ADDR"] == "::1" and seen["SERVER_PORT"] == "8443"
    assert seen["body"] == b"{}" and seen["wsgi.url_scheme"] == "https"


class BlockingAttempts(NoCluster):
    """An attempt source that, like the server's (``webhook.serving.worker.LoopAttempts``), may
    not block the event loop's thread: there it raises ``NeedsThread``."""

    def __init__(self):
        self.loop_thread: int | None = None
        self.threads: list[str] = []

    def job_failures(self, namespace: str, name: str, uid: str) -> AttemptLookup:
        if threading.get_ident() == self.loop_thread:
            raise NeedsThread
        self.threads.append(threading.current_thread().name)
        return AttemptLookup(3, "Job status (API)")

    def stats(self) -> dict:
        return {"enabled": True, "synced": True}


def test_a_request_that_must_wait_on_the_api_is_answered_on_a_thread():
    """The one request that needs the API is run again on a pool thread, whole: the
    answer is the one a blocking lookup gives, and nothing was recorded twice."""
    from testkit.builders import job_owner, pod
    from webhook.serving import metrics as metrics_module

    attempts = BlockingAttempts()
    recorder = metrics_module.Metrics()
    app = create_app(State(attempts=attempts, metrics=recorder))
    pool = ThreadPoolExecutor(2, thread_name_prefix="api-wait")
    served = WsgiOverRsgi(app, MAX_BODY_BYTES, 5.0, pool)
    annotations = {"retry-policy.dev/backoff-limit": "3", "retry-policy.dev/non-spot-attempts": "1"}
    body = json.dumps(review(pod(annotations, owner=job_owner()))).encode()

    async def main():
        attempts.loop_thread = threading.get_ident()
        proto = Proto([body])
        await served.__rsgi__(scope_with(("content-length", str(len(body)))), proto)
        return proto

    proto = asyncio.run(main())
    pool.shutdown()
    status, _, raw = proto.sent
    answer = json.loads(raw)["response"]
    assert status == 200 and answer.get("patchType") == "JSONPatch"  # last attempt: placed
    assert attempts.threads and all(t.startswith("api-wait") for t in attempts.threads)
    recorder.flush()
    counted = [
        s.value
        for family in recorder.registry.collect()
        for s in family.samples
        if s.name == "retry_webhook_admission_duration_seconds_count"
    ]
    assert counted == [1.0]  # the first, abandoned run recorded nothing
