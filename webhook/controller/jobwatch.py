"""One watch of Jobs for every reconciler that reads them (the history recorder, the
failed-Job judge, the audit reporter), as client-go's shared informers give a controller
one watch per resource however many handlers it has. Each handler is a (reset, apply) pair,
called in the order it subscribed, on the watch's thread; a handler that fails does not
stop the others.

A reconciler built with the controller's ``SharedJobs`` subscribes to it at once (before
the watch lists: none of the list is missed) and the manager runs the watch as one more
reconciler; one built alone (tests) makes a watch of its own and runs it itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from webhook.cluster.informer import Informer

log = logging.getLogger(__name__)

Reset = Callable[[], None]
Apply = Callable[[str, Mapping[str, Any]], None]


class SharedJobs:
    """The controller's one list-then-watch of Jobs (a reconciler: ``run``)."""

    name = "jobs"

    def __init__(self, batch_api: Any) -> None:
        self.batch = batch_api
        self._handlers: list[tuple[Reset, Apply]] = []
        self._lock = threading.Lock()
        self._informer: Informer | None = None
        #: Set once the watch has listed every Job: made here, not by the informer, so that
        #: a reconciler that waits on it before the watch starts waits for that list.
        self._synced = threading.Event()

    def subscribe(self, reset: Reset, apply: Apply) -> None:
        with self._lock:
            self._handlers.append((reset, apply))

    @property
    def synced(self) -> threading.Event:
        return self._synced

    @property
    def watches(self) -> list[Informer]:
        return [self._informer] if self._informer is not None else []

    def run(self, stop: threading.Event) -> None:
        self._informer = Informer(
            "jobs",
            self.batch.list_job_for_all_namespaces,
            self._reset,
            self._apply,
            {},
            stop,
            "controller",
        )
        self._informer.synced = self._synced
        self._informer.run()

    def start(self, stop: threading.Event) -> None:
        """Run it on a thread of its own (a reconciler that made its own watch)."""
        threading.Thread(target=self.run, args=(stop,), name="jobs", daemon=True).start()

    def _reset(self) -> None:
        with self._lock:
            handlers = list(self._handlers)
        for reset, _ in handlers:
            try:
                reset()
            except Exception:
                log.exception("a Job watch handler's reset failed")

    def _apply(self, kind: str, job: Mapping[str, Any]) -> None:
        with self._lock:
            handlers = list(self._handlers)
        for _, apply in handlers:
            try:
                apply(kind, job)
            except Exception:
                log.exception("a Job watch handler failed on a Job")
