"""Structured JSON logs: one object per line, safe to ship to any log pipeline.

Every line the server's processes write is JSON: our own records, granian's (its Rust
side logs through Python's ``logging``, as logger ``_granian``), Python warnings and
uncaught exceptions in any thread. Each line carries ``pid``, so lines of different
workers (and the supervisor's) can be told apart.

Admission logs carry identifiers and outcomes only. Object bodies, annotation values
and env var values never reach a log record: they may hold secrets.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import sys
import threading
import time
import weakref
from types import TracebackType

import orjson

#: The logger of the server's own lines: the supervisor's, the workers', the certificate's
#: and the sockets' (``webhook.serving``'s supervisor, worker, certwatch and listeners). One
#: name, kept from when they were one module: log queries select lines by it.
SERVER_LOGGER = "webhook.serving.server"

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        try:
            return orjson.dumps(entry, default=str).decode()
        except TypeError:  # keys orjson refuses (non-str): the slower, laxer encoder
            return json.dumps(entry, default=str, separators=(",", ":"))


class DecisionLog:
    """The per-admission line, written straight to the log handler's stream, in batches.

    It is the one line written for every request, so it skips the ``logging`` machinery
    (a LogRecord, a caller lookup through the stack, the generic formatter), and it does
    not take the handler's lock per line: under load, the threads serving requests
    queued on that lock and on one write system call each (a fifth of the server's
    thread time in a profile). Lines are queued (a deque: appends are atomic) and
    written together, one write under the handler's lock (never interleaved with other
    records), by the request that finds the oldest queued line ``max_delay`` seconds old
    or ``max_lines`` queued, by the worker's maintenance loop every second, and at exit.
    A quiet server writes each line at once; a busy one, ten times a second. The lines
    have the same fields and shape as every other, and honour the logger's level; their
    ``ts`` is when the decision was made.
    """

    def __init__(
        self, name: str = "webhook.admission", max_delay: float = 0.1, max_lines: int = 512
    ):
        self.logger = logging.getLogger(name)
        self.max_delay = max_delay
        self.max_lines = max_lines
        self._second = -1
        self._stamp = ""
        self._handler: logging.StreamHandler | None = None
        self._queue: collections.deque[str] = collections.deque()
        self._flushing = threading.Lock()
        self._flushed_at = 0.0
        _QUEUED.add(self)

    def write(self, fields: dict) -> None:
        if not self.logger.isEnabledFor(logging.INFO):
            return
        now = time.time()
        second = int(now)
        if second != self._second:  # once a second, not once per request:
            self._second, self._stamp = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
            self._handler = _json_handler(self.logger)  # (logging may be set up anew)
        handler = self._handler
        if handler is None:  # not set up for JSON (tests of the app alone): plain logging
            self.logger.info("admission decision", extra=fields)
            return
        entry = {
            "ts": f"{self._stamp}.{int((now - second) * 1000):03d}Z",
            "level": "info",
            "logger": self.logger.name,
            "pid": os.getpid(),
            "msg": "admission decision",
            **fields,
        }
        self._queue.append(orjson.dumps(entry, default=str).decode() + handler.terminator)
        if now - self._flushed_at >= self.max_delay or len(self._queue) >= self.max_lines:
            self.flush()

    def flush(self) -> None:
        """Write every queued line; a no-op while another thread is writing them."""
        if not self._queue or not self._flushing.acquire(blocking=False):
            return
        try:
            self._flushed_at = time.time()
            lines = []
            while self._queue:
                lines.append(self._queue.popleft())
            handler = _json_handler(self.logger)
            if handler is None:
                return
            handler.acquire()
            try:
                handler.stream.write("".join(lines))
                handler.flush()
            finally:
                handler.release()
        finally:
            self._flushing.release()


#: Every DecisionLog alive, for ``flush_decisions``.
_QUEUED: weakref.WeakSet[DecisionLog] = weakref.WeakSet()


def flush_decisions() -> None:
    """Write queued decision lines now (the maintenance loop, and a worker at exit)."""
    for log in _QUEUED:
        log.flush()


def _json_handler(logger: logging.Logger) -> logging.StreamHandler | None:
    while logger is not None:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and isinstance(
                handler.formatter, JsonFormatter
            ):
                return handler
        if not logger.propagate:
            return None
        logger = logger.parent
    return None


def setup(level: str = "info", json_format: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_format:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if json_format:
        logging.captureWarnings(True)  # warnings.warn -> logger "py.warnings"
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_thread_uncaught


def _log_uncaught(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, tb)
        return
    logging.getLogger("webhook").critical("uncaught exception", exc_info=(kind, value, tb))


def _log_thread_uncaught(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    logging.getLogger("webhook").error(
        "uncaught exception in thread",
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        extra={"thread": getattr(args.thread, "name", None)},
    )
