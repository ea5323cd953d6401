"""The Flask app (WSGI) served through granian's RSGI interface, its bodies read without
holding a thread.

granian's own WSGI interface calls the app on a thread as soon as a request's headers are
in, and the app then blocks that thread reading the body, with no time limit: a client
that trickles a body holds a thread for as long as it likes, as it held one of gunicorn's.
Here the body is read on the worker's event loop (an ``await``: no thread is held while it
arrives), within ``body_timeout`` seconds and never more than one byte past the body
limit, and only then is the Flask app called, with the whole body in memory. The app sees
a plain WSGI request and answers as before:

- a ``Content-Length`` over the limit: the body is not read at all, the app answers 413;
- a chunked body over the limit: reading stops one byte past it, the app answers 413;
- a body not received in time (or the client gone): the app reads a stream that fails, and
  answers 408 ``request body not received``;

and each of those answers closes the connection (the rest of its body is never read).

The app runs on the event loop's thread: admission work is CPU-bound, and the GIL would
serialise threads anyway, so a hand-over to a thread would only add its cost to every
request. The one exception is an answer that has to wait for the Kubernetes API (an
attempt-cache miss: ``webhook/serving/worker.py``), which raises ``NeedsThread`` on the loop
thread before it would block; the request is then run again, from the start, on a thread
of ``pool``.

While the worker is being replaced (a new certificate: ``webhook/serving/supervisor.py``), every
answer carries ``Connection: close``: each kept-alive connection is closed by the server
right after a response, the one moment a client never reuses it, instead of while idle,
when a client may be sending a request on it at that very moment.
"""

from __future__ import annotations

import asyncio
import io
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import Any
from urllib.parse import unquote_to_bytes

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

CLOSE = ("connection", "close")
#: Seconds between checks of the bodies being read against their timeout.
SWEEP = 0.25


class NeedsThread(BaseException):
    """Raised on the event loop's thread by code that would block on I/O there.

    A ``BaseException``, so that the app's handlers (which turn every ``Exception`` of
    the policy into an answer) and Flask let it through to ``WsgiOverRsgi``, which runs
    the request again on a thread. Raised before anything of the request is recorded
    (decision log, metrics), so the second run is the only one that counts."""


class _Unreadable(io.RawIOBase):
    """The input of a request whose body did not arrive: reading it fails as a socket
    read fails, and the app answers 408."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        raise TimeoutError("request body not received in time")


class WsgiOverRsgi:
    """An RSGI application (``__rsgi__``) serving a WSGI app; see the module docstring."""

    def __init__(
        self,
        app: WsgiApp,
        max_body: int,
        body_timeout: float,
        pool: Executor | None = None,
        scheme: str = "https",
    ):
        self.app = app
        self.max_body = max_body
        self.body_timeout = body_timeout
        self.pool = pool
        #: Set while the worker drains: every answer then closes its connection.
        self.draining = False
        self._base: dict[str, Any] = {
            "SCRIPT_NAME": "",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": scheme,
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": pool is not None,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
            # The whole body is in the stream, and the stream ends with it.
            "wsgi.input_terminated": True,
        }
        self._keys: dict[str, str] = {}
        #: Bodies being read: the request's task, and when its time is up.
        self._reading: dict[asyncio.Task, float] = {}
        self._expired: set[asyncio.Task] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    # --- RSGI ---------------------------------------------------------------------
    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":  # websockets are off; nothing else is RSGI-HTTP
            return
        environ = self._environ(scope)
        length = environ.get("CONTENT_LENGTH")
        close = False
        body = b""
        if length is not None:
            size = int(length)  # the HTTP layer refuses a Content-Length that is not one
            if size > self.max_body:
                close = True  # answered (413) without reading it
            elif size:
                body, close = await self._read(proto, self._read_all(proto))
        elif environ.pop("_chunked", False):
            body, close = await self._read(proto, self._read_chunks(proto))
        if close and body is None:
            environ["wsgi.input"] = io.BufferedReader(_Unreadable())
        else:
            environ["wsgi.input"] = io.BytesIO(body)
            if length is None:
                environ["CONTENT_LENGTH"] = str(len(body))
        try:
            status, headers, content = self.call(environ)
        except NeedsThread:
            if self.pool is None:
                raise RuntimeError("the app needs a thread, and there is no pool") from None
            environ["wsgi.input"] = io.BytesIO(body or b"")
            loop = asyncio.get_running_loop()
            status, headers, content = await loop.run_in_executor(self.pool, self.call, environ)
        if close or self.draining:
            headers.append(CLOSE)
        proto.response_bytes(status, headers, content)

    def call(self, environ: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
        """Run the WSGI app to its end: status, headers and the whole body."""
        started: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None):
            started[:] = [status, headers]
            return _no_write

        chunks = self.app(environ, start_response)
        try:
            content = b"".join(chunks)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        return int(started[0][:3]), list(started[1]), content

    # --- the body -------------------------------------------------------------------
    async def _read(self, proto: Any, reading: Any) -> tuple[bytes | None, bool]:
        """``(body, close)``: the body read within the timeout, ``None`` when it was not
        received; ``close`` when the connection must close after the answer.

        The timeout is kept by one sweep of the bodies being read (``_sweep``, a few times
        a second while there are any), not by a timer per request: most bodies are in
        before the first sweep, and a timer made and cancelled for each cost more than
        the rest of the read."""
        task = asyncio.current_task()
        if task is None:  # not run as a task (nothing to cancel): read without a limit
            return await reading
        self._reading[task] = time.monotonic() + self.body_timeout
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP, self._sweep)
        try:
            return await reading
        except asyncio.CancelledError:
            if task not in self._expired:
                raise  # not our timeout: the worker is stopping
            self._expired.discard(task)
            if hasattr(task, "uncancel"):
                task.uncancel()  # handled here: the request goes on to its 408
            return None, True
        except Exception:  # the client went away mid-body
            return None, True
        finally:
            self._reading.pop(task, None)

    def _sweep(self) -> None:
        """Cancel the reads that are past their time; again later while any are left."""
        self._sweeper = None
        now = time.monotonic()
        for task, deadline in list(self._reading.items()):
            if deadline <= now:
                del self._reading[task]
                self._expired.add(task)
                task.cancel()
        if self._reading:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP, self._sweep)

    async def _read_all(self, proto: Any) -> tuple[bytes, bool]:
        return await proto(), False

    async def _read_chunks(self, proto: Any) -> tuple[bytes, bool]:
        """A body without a length, up to one byte past the limit (the app then answers
        413 without the rest being read)."""
        parts: list[bytes] = []
        size = 0
        async for chunk in proto:
            parts.append(chunk)
            size += len(chunk)
            if size > self.max_body:
                return b"".join(parts)[: self.max_body + 1], True
        return b"".join(parts), False

    # --- the environ ----------------------------------------------------------------
    def _environ(self, scope: Any) -> dict[str, Any]:
        environ = dict(self._base)
        path = scope.path
        if "%" in path:
            path = unquote_to_bytes(path).decode("latin-1")
        environ["REQUEST_METHOD"] = scope.method
        environ["PATH_INFO"] = path
        environ["QUERY_STRING"] = scope.query_string
        environ["SERVER_PROTOCOL"] = "HTTP/" + scope.http_version
        server, _, port = scope.server.rpartition(":")
        environ["SERVER_NAME"] = server.strip("[]")
        environ["SERVER_PORT"] = port
        client, _, client_port = scope.client.rpartition(":")
        environ["REMOTE_ADDR"] = client.strip("[]")
        environ["REMOTE_PORT"] = client_port
        keys = self._keys
        for name, value in scope.headers.items():
            key = keys.get(name)
            if key is None:
                key = _environ_key(name)
                if len(keys) < 256:  # header names come from clients: keep a bounded few
                    keys[name] = key
            if key in environ:
                if key == "CONTENT_LENGTH":
                    continue  # the HTTP layer made sure repeated lengths agree
                environ[key] += "," + value
            else:
                environ[key] = value
        if "HTTP_TRANSFER_ENCODING" in environ and "CONTENT_LENGTH" not in environ:
            environ["_chunked"] = True
        return environ


def _environ_key(name: str) -> str:
    name = name.lower()
    if name == "content-type":
        return "CONTENT_TYPE"
    if name == "content-length":
        return "CONTENT_LENGTH"
    return "HTTP_" + name.upper().replace("-", "_")


def _no_write(data: bytes) -> None:
    raise NotImplementedError("write() of start_response is not supported")


__all__ = ["NeedsThread", "WsgiOverRsgi"]
