"""Releasing retry-delay gates: on time while a controller leads, at once when one returns,
and all of them on demand (``retry-webhook release-gates``, the chart's delete hook).

The webhook gates a pod (``webhook.kube.gates``) only while a controller leads, and labels
it, so this reconciler lists and watches exactly the gated pods (label selector
``GATED_LABEL``, all namespaces) and removes each gate when its ``not-before`` comes. It
runs on the leader only (``webhook.controller.manager``); a leader that takes over (after
a leader died mid-delay) starts with a list, in which every gate whose time has passed is
released at once: a gate never outlives the controller by more than a lease duration.

Only our gate and our label are removed, with a JSON patch that tests that the gate is
still where it was read (``release_patch``); when the pod changed in between (422: the
test failed; 409), it is read again and the patch made anew. A pod without a readable
``not-before`` is released at once.
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from webhook.cluster.events import Regarding
from webhook.cluster.informer import Informer, short_error
from webhook.controller.records import workload_of
from webhook.controller.writes import Writes
from webhook.kube import apiclient, gates
from webhook.policy.grammar import BadValue, parse_time

log = logging.getLogger(__name__)

#: Conflicts (the pod changed between read and patch) tolerated per release.
MAX_ATTEMPTS = 5
#: A gate released this long after its time was overdue (its leader was away).
OVERDUE_SECONDS = 10.0
#: Seconds after a failed release during which no gate is added, unless one succeeds.
COOLDOWN = 60.0


class ReleaseError(Exception):
    """The API refused or failed a release (``status``: its HTTP status, if any; ``body``:
    the API's Status, for what the release says of it)."""

    def __init__(self, message: str, status: int | None = None, body: Any = None):
        super().__init__(message)
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Released:
    """What became of one gated pod: ``released`` (gate and label removed), ``gone`` (the
    pod no longer exists), ``free`` (it holds neither any more)."""

    namespace: str
    name: str
    result: str
    not_before: str | None

    def __str__(self) -> str:
        when = f" (not-before {self.not_before})" if self.not_before else ""
        return f"pod {self.namespace}/{self.name}: {self.result}{when}"


def _status(err: Exception) -> int | None:
    return getattr(err, "status", None)


def _describe(err: Exception) -> str:
    return apiclient.describe(err)[1]


def read_pod(core: Any, namespace: str, name: str) -> dict[str, Any] | None:
    """One pod, read with a list of its namespace by name (the RBAC to list pods is what
    the webhook and the release Job have; no ``get``); ``None`` when it is gone."""
    resp = core.list_namespaced_pod(
        namespace,
        field_selector=f"metadata.name={name}",
        _preload_content=False,
        _request_timeout=(5, 30),
    )
    items = json.loads(resp.data).get("items") or []
    return items[0] if items and isinstance(items[0], dict) else None


def release(core: Any, pod: Mapping[str, Any], dry_run: bool = False) -> Released:
    """Remove our gate and label from ``pod`` (as read), reading it again after a
    conflict (409, or 422 from the patch's ``test``: the gates moved); raises
    ``ReleaseError`` when the API fails or refuses it (a 422 on a pod that did not change
    since it was read is a refusal: an admission webhook or policy), or when the pod is
    still changing after ``MAX_ATTEMPTS`` reads (status 409: to be tried again)."""
    meta = pod.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    when = gates.not_before(pod)
    current: Mapping[str, Any] | None = pod
    for _ in range(MAX_ATTEMPTS):
        if current is None:
            return Released(namespace, name, "gone", when)
        patch = gates.release_patch(current)
        if not patch:
            return Released(namespace, name, "free", when)
        if dry_run:
            return Released(namespace, name, "would be released", when)
        try:
            core.patch_namespaced_pod(
                name,
                namespace,
                patch,
                _content_type="application/json-patch+json",
                _preload_content=False,
                _request_timeout=(5, 30),
            )
            return Released(namespace, name, "released", when)
        except Exception as err:
            status = _status(err)
            if status == 404:
                return Released(namespace, name, "gone", when)
            refused = ReleaseError(f"pod {namespace}/{name}: {_describe(err)}", status, _body(err))
            if status not in (409, 422):
                raise refused from None
        try:  # it changed since it was read: read it again
            fresh = read_pod(core, namespace, name)
        except Exception as err:
            raise ReleaseError(f"pod {namespace}/{name}: {_describe(err)}", _status(err)) from None
        if status == 422 and fresh is not None and _version(fresh) == _version(current):
            raise refused
        current = fresh
    message = f"pod {namespace}/{name}: still changing after {MAX_ATTEMPTS} reads"
    raise ReleaseError(message, 409)


def _version(pod: Mapping[str, Any]) -> Any:
    return (pod.get("metadata") or {}).get("resourceVersion")


def _body(err: Exception) -> Any:
    return getattr(err, "body", None)


def gated_pods(core: Any, namespace: str | None = None) -> Iterator[dict[str, Any]]:
    """Every pod that carries our label, in ``namespace`` or all namespaces (paged)."""
    token = None
    while True:
        kwargs: dict[str, Any] = {
            "label_selector": gates.GATED_LABEL,
            "limit": 500,
            "_continue": token,
            "_preload_content": False,
            "_request_timeout": (5, 60),
        }
        if namespace is None:
            resp = core.list_pod_for_all_namespaces(**kwargs)
        else:
            resp = core.list_namespaced_pod(namespace, **kwargs)
        page = json.loads(resp.data)
        yield from (p for p in page.get("items") or [] if isinstance(p, dict))
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


def release_all(
    core: Any, namespace: str | None = None, dry_run: bool = False
) -> tuple[list[Released], list[str]]:
    """Release every gate of ours (``retry-webhook release-gates``): what became of each
    pod, and the errors (every pod is tried)."""
    done: list[Released] = []
    errors: list[str] = []
    for pod in gated_pods(core, namespace):
        try:
            done.append(release(core, pod, dry_run))
        except ReleaseError as err:
            errors.append(str(err))
    return done, errors


def due_time(pod: Mapping[str, Any]) -> float:
    """When the pod's gate may go: its ``not-before``, else now (0: at once)."""
    text = gates.not_before(pod)
    if text is None:
        return 0.0
    try:
        return parse_time(text)
    except BadValue:
        return 0.0


# --- the reconciler -----------------------------------------------------------------------


class Recorder(Protocol):
    def gates_pending(self, count: int) -> None: ...

    def gate_released(self, reason: str) -> None: ...


class _NoRecorder:
    def gates_pending(self, count: int) -> None:
        pass

    def gate_released(self, reason: str) -> None:
        pass


@dataclass
class _Pending:
    pod: Mapping[str, Any]
    due: float


@dataclass
class _Failing:
    """Releases failing since ``first``, the last at ``last``, for ``why``."""

    first: float
    last: float
    why: str


class GateReleaser:
    """Watches the gated pods and releases each gate when its time comes (see above)."""

    name = "retry-delay-gates"

    def __init__(
        self,
        core: Any,
        recorder: Recorder | None = None,
        clock: Callable[[], float] = time.time,
        events: Any = None,
    ):
        self.core = core
        self.recorder = recorder or _NoRecorder()
        self.clock = clock
        self._lock = threading.Condition()
        self._pending: dict[str, _Pending] = {}
        #: (due, uid): the next to release first; stale entries are skipped.
        self._queue: list[tuple[float, str]] = []
        self.released = 0
        #: Failed releases, each pod's back-off, and the ones refused (given up).
        self.writes = Writes("gates", events, recorder, clock=clock)
        #: UID -> resourceVersion of pods whose release was refused: not tried again until
        #: the pod changes.
        self._refused: OrderedDict[str, str] = OrderedDict()
        self._failing: _Failing | None = None
        self._informer: Informer | None = None

    # --- what the watch delivers (its thread) ---------------------------------------------
    def _reset(self) -> None:
        with self._lock:
            self._pending.clear()
            self._queue.clear()

    def _apply(self, kind: str, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not isinstance(uid, str):
            return
        with self._lock:
            refused = self._refused.get(uid)
            if kind == "DELETED" or meta.get("deletionTimestamp") or not gates.held(pod):
                self._pending.pop(uid, None)
            elif refused is None or refused != meta.get("resourceVersion"):
                due = due_time(pod)
                if not self.writes.ready(uid):  # a failed release's back-off still runs
                    due = max(due, self.writes.due(uid))
                self._pending[uid] = _Pending(pod, due)
                heapq.heappush(self._queue, (due, uid))
            self.recorder.gates_pending(len(self._pending))
            self._lock.notify_all()

    # --- whether gates are being released: what admission gates by ---------------------
    def health(self) -> str:
        """ "" while gates are being released (or there are none to release); else why not.
        Admission adds no gate then (``webhook.cluster.leadership``): a gate must never be
        added that nobody removes. Not healthy: the watch of gated pods has not listed, or
        fails; a release failed and none succeeded since (for ``COOLDOWN`` seconds after
        the last failure: a pod refused for its own sake must not stop gating for good);
        a gate overdue by more than ``OVERDUE_SECONDS`` (the releases are stuck)."""
        informer = self._informer
        if informer is None or not informer.synced.is_set():
            return "the gated pods are not listed yet"
        if informer.last_error:
            return f"the watch of gated pods fails ({informer.last_error})"
        now = self.clock()
        with self._lock:
            failing = self._failing
            overdue = sum(1 for e in self._pending.values() if now - e.due > OVERDUE_SECONDS)
        if failing is not None and now - failing.last < COOLDOWN:
            return f"gate releases fail ({failing.why})"
        if overdue:
            return f"{overdue} gates overdue by more than {OVERDUE_SECONDS:.0f}s"
        return ""

    def _outcome(self, failed: str | None) -> None:
        """A release went through (``None``) or failed (why)."""
        now = self.clock()
        with self._lock:
            if failed is None:
                self._failing = None
            elif self._failing is None:
                self._failing = _Failing(now, now, failed)
            else:
                self._failing.last, self._failing.why = now, failed

    # --- the loop ------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        informer = self._informer = Informer(
            "gated-pods",
            self.core.list_pod_for_all_namespaces,
            self._reset,
            self._apply,
            {"label_selector": gates.GATED_LABEL},
            stop,
            label="retry-delay gates",
        )
        self.watches = [informer]
        watch = threading.Thread(target=informer.run, name="watch-gated-pods", daemon=True)
        watch.start()
        # Wake on stop too (the condition is not the event).
        waker = threading.Thread(target=self._wake_on, args=(stop,), daemon=True)
        waker.start()
        while not stop.is_set():
            due = self._next_due()
            if due is None:
                continue
            self._release(*due)
        with self._lock:
            self._lock.notify_all()

    def _wake_on(self, stop: threading.Event) -> None:
        stop.wait()
        with self._lock:
            self._lock.notify_all()

    def _next_due(self) -> tuple[str, _Pending] | None:
        """The next pod whose time has come, waiting for it (``None``: woken early)."""
        with self._lock:
            while self._queue:
                due, uid = self._queue[0]
                entry = self._pending.get(uid)
                if entry is None or entry.due != due:
                    heapq.heappop(self._queue)  # released, gone, or rescheduled
                    continue
                wait = due - self.clock()
                if wait > 0:
                    self._lock.wait(min(wait, 1.0))
                    return None
                heapq.heappop(self._queue)
                return uid, entry
            self._lock.wait(1.0)
            return None

    def _release(self, uid: str, entry: _Pending) -> None:
        late = self.clock() - entry.due
        try:
            done = release(self.core, entry.pod)
        except ReleaseError as err:
            self._outcome(short_error(err))  # (short: it goes on the Lease and in warnings)
            what = f"the release of the retry-delay gate of pod {_name(entry.pod)}"
            retry = self.writes.failed(uid, err, _workload(entry.pod), what)
            with self._lock:
                if self._pending.get(uid) is not entry:
                    return
                if retry:  # after its back-off
                    entry.due = self.writes.due(uid)
                    heapq.heappush(self._queue, (entry.due, uid))
                    return
                del self._pending[uid]  # refused: until the pod changes
                meta = entry.pod.get("metadata") or {}
                self._refused[uid] = str(meta.get("resourceVersion") or "")
                while len(self._refused) > 10_000:
                    self._refused.popitem(last=False)
                self.recorder.gates_pending(len(self._pending))
            return
        self._outcome(None)
        self.writes.landed(uid)
        with self._lock:
            if self._pending.get(uid) is entry:
                del self._pending[uid]
            self.recorder.gates_pending(len(self._pending))
        if done.result == "released":
            self.released += 1
            reason = "overdue" if late > OVERDUE_SECONDS else "due"
            reason = "no_time" if entry.due == 0.0 else reason
            self.recorder.gate_released(reason)
            log.info(
                "retry-delay gate released",
                extra={
                    "pod": f"{done.namespace}/{done.name}",
                    "not_before": done.not_before,
                    "late_seconds": round(max(late, 0.0), 3),
                },
            )

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)


def _name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _workload(pod: Mapping[str, Any]) -> Regarding | None:
    """What a gate's Event regards: the pod's Job or JobSet, else the pod (a bare pod is
    its own workload)."""
    found = workload_of(pod)
    if found is not None:
        return found
    meta = pod.get("metadata") or {}
    fields = [meta.get(k) for k in ("namespace", "name", "uid")]
    if not all(isinstance(v, str) and v for v in fields):
        return None
    return Regarding("v1", "Pod", *fields)
