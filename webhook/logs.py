"""Structured JSON logs: one object per line, safe to ship to any log pipeline.

Every line the server process writes is JSON: our own records, gunicorn's (through
``GunicornLogger``), Python warnings and uncaught exceptions in any thread. Each line
carries ``pid``, so lines of different gunicorn workers can be told apart.

Admission logs carry identifiers and outcomes only. Object bodies, annotation values
and env var values never reach a log record: they may hold secrets.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from types import TracebackType

from gunicorn import glogging

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
        return json.dumps(entry, default=str, separators=(",", ":"))


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


class GunicornLogger(glogging.Logger):
    """gunicorn's own lines (start, workers booting and exiting, errors) as JSON too."""

    def setup(self, cfg) -> None:
        super().setup(cfg)
        for logger in (self.error_log, self.access_log):
            for handler in logger.handlers:
                handler.setFormatter(JsonFormatter())
