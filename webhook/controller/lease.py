"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's does it.

Every replica runs a controller process; one holds the Lease and acts, the others stand
by and take over when it lapses. The rules are client-go's ``tryAcquireOrRenew``
(tools/leaderelection/leaderelection.go), so the Lease reads the same to ``kubectl`` and
to anyone who knows Kubernetes controllers:

- no Lease: create it, holding it;
- a Lease held by another: wait until its record has not changed for its
  ``leaseDurationSeconds``, measured on this replica's own clock from when the change
  was *observed* (``isLeaseValid``), never from the record's ``renewTime`` (replicas'
  clocks may disagree);
- take or renew it with an update that carries the ``resourceVersion`` read: of two
  replicas that try at once, one gets 409 Conflict and stays a standby;
- a leader may act until its last successful renewal *started* plus ``renew_deadline``
  (``fence``: ``webhook.controller.fence``), and stops leading then, whatever call it is
  blocked in (client-go's ``renew`` runs each renewal under that deadline);
- on a clean stop, the leader releases the Lease (``release``: empty holder, duration
  1 s) so a standby takes over within a retry period instead of a lease duration.

The leader also says on the Lease whether its retry-delay gates are being released
(``GATES_ANNOTATION``: "ok", else why not; ``health``), written with each renewal: the
admission workers of every replica gate pods only while it says "ok", and the standbys'
controllers, which read the Lease every retry period anyway, pass it on to theirs.

The Python client ships a leader elector too, but it neither releases on stop nor says
what it observed; this one publishes every observation (``LeaderState``) for the
admission workers.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from webhook.cluster.leadership import LeaderState
from webhook.controller.fence import Fence

log = logging.getLogger(__name__)

#: On the Lease: whether the leader's retry-delay gates are being released ("ok"), else
#: why not (``webhook.controller.gates.GateReleaser.health``).
GATES_ANNOTATION = "retry-policy.dev/gate-releases"
#: What an acquisition writes there: no leader acts yet (its first renewal says "ok").
ACQUIRING = "a replica is taking the Lease; no gate is released until it renews"


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    #: client-go's defaults for controllers (kube-controller-manager: 15 s, 10 s, 2 s).
    lease_seconds: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


def _micro_time(when: float) -> str:
    """A ``MicroTime`` as the API writes it."""
    return dt.datetime.fromtimestamp(when, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(lease: dict[str, Any]) -> tuple[Any, ...]:
    """What a change of the Lease is judged by: the spec (client-go compares the raw
    record)."""
    spec = lease.get("spec") or {}
    return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in spec.items()))


class LeaderElector:
    """One replica's side of the election. ``run`` loops until ``stop`` is set; while it
    leads, ``leading`` is set. Each observation is passed to ``publish``."""

    def __init__(
        self,
        api: Any,
        config: LeaseConfig,
        publish: Callable[[LeaderState], None] = lambda state: None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        health: Callable[[], str] = lambda: "",
        fence: Fence | None = None,
    ):
        self.api = api  # a kubernetes.client.CoordinationV1Api
        self.config = config
        self.publish = publish
        #: While leading: "" when its gates are being released, else why not.
        self.health = health
        self.clock = clock
        self.wall = wall
        #: Until when this replica may act: each successful acquisition or renewal extends
        #: it to when the attempt started plus ``renew_deadline`` (on ``clock``).
        self.fence = fence if fence is not None else Fence(clock)
        self.leading = threading.Event()
        #: The record last observed, when (this replica's clock, and wall clock), and
        #: its duration and holder.
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._observed_wall = 0.0
        self._observed_seconds = config.lease_seconds
        self._holder = ""
        #: What the holder last said of its gate releases ("" : they work, or it says
        #: nothing: a version of the webhook before it did).
        self._gates = ""
        #: The Lease as last written or read (with its resourceVersion): what a leader's
        #: renewal updates at once (client-go's observed record).
        self._cached: dict[str, Any] | None = None
        self.errors = 0

    # --- one attempt (client-go's tryAcquireOrRenew) ---------------------------------------
    def try_acquire_or_renew(self) -> bool:
        """One attempt, as client-go's ``tryAcquireOrRenew``: a leader whose Lease is still
        valid renews with one update of the record it observed (the fast path); otherwise,
        or when that update fails, read the Lease and take or renew it.

        No call has a timeout of its own shorter than the renew deadline (client-go's
        ``acquire`` has none; ``renew`` runs under one ``RenewDeadline`` context): a leader's
        calls end when its fence does, a standby's after ``renew_deadline``. A write that
        takes longer than a retry period is waited for, not abandoned while it lands."""
        now, wall = self.clock(), self.wall()
        if self.leading.is_set() and self._cached is not None and self._valid(now):
            if self._renew_fast(now, wall):
                return True
        return self._slow_path(now, wall)

    def _timeout(self) -> float:
        """What a call may take: a leader's until its fence (the round's deadline), a
        standby's the renew deadline."""
        if self.leading.is_set() and self.fence.holds():
            return max(0.0, self.fence.remaining())
        return self.config.renew_deadline

    def _valid(self, now: float) -> bool:
        return now < self._observed_at + self._observed_seconds

    def _renew_fast(self, now: float, wall: float) -> bool:
        cfg = self.config
        body = self._body(self._cached, wall, acquire=False)
        try:
            written = self._call(self.api.replace_namespaced_lease, cfg.name, cfg.namespace, body)
        except Exception as err:
            self.errors += 1
            log.info(
                "cannot renew Lease %s/%s at once (%s): reading it",
                cfg.namespace,
                cfg.name,
                _short(err),
            )
            return False
        self._observe(written, now, wall)
        self.fence.extend(now + cfg.renew_deadline)
        return True

    def _slow_path(self, now: float, wall: float) -> bool:
        cfg = self.config
        try:
            lease = self._get()
        except Exception as err:
            self.errors += 1
            log.warning("cannot read Lease %s/%s: %s", cfg.namespace, cfg.name, _short(err))
            return False
        if lease is None:
            body = self._body(None, wall, acquire=True)
            try:
                written = self._call(self.api.create_namespaced_lease, cfg.namespace, body)
            except Exception as err:  # someone else created it first (409), or an outage
                self.errors += 1
                log.info("cannot create Lease %s/%s: %s", cfg.namespace, cfg.name, _short(err))
                return False
            self._observe(written, now, wall)
            self.fence.extend(now + cfg.renew_deadline)
            return True
        record = _record(lease)
        if record != self._observed:
            self._observe(lease, now, wall)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if holder and holder != cfg.identity and self._valid(now):
            return False  # held by another, not lapsed
        ours = holder == cfg.identity and self.leading.is_set()
        body = self._body(lease, wall, acquire=not ours)
        try:
            written = self._call(
                self.api.replace_namespaced_lease, cfg.name, cfg.namespace, body
            )  # carries the resourceVersion read: a precondition
        except Exception as err:
            self.errors += 1
            log.info("cannot take or renew Lease %s/%s: %s", cfg.namespace, cfg.name, _short(err))
            return False
        self._observe(written, now, wall)
        # From when the attempt started, not when it returned: a standby counts the lease
        # from when it saw this renewal, which was after it was sent.
        self.fence.extend(now + cfg.renew_deadline)
        return True

    def _body(self, lease: dict[str, Any] | None, wall: float, acquire: bool) -> dict[str, Any]:
        cfg = self.config
        old = (lease or {}).get("spec") or {}
        transitions = int(old.get("leaseTransitions") or 0)
        stamp = _micro_time(wall)
        spec = {
            "holderIdentity": cfg.identity,
            "leaseDurationSeconds": round(cfg.lease_seconds),
            "acquireTime": stamp if acquire else old.get("acquireTime", stamp),
            "renewTime": stamp,
            "leaseTransitions": transitions + 1 if acquire and lease is not None else transitions,
        }
        metadata: dict[str, Any] = {"name": cfg.name, "namespace": cfg.namespace}
        if lease is not None:
            metadata = dict(lease.get("metadata") or {}, **metadata)
        annotations = dict(metadata.get("annotations") or {})
        # Only a leader's renewal vouches for its gate releases: an acquisition may land
        # and still never be answered in time (a slow API), and a Lease that says "ok"
        # while no replica leads would have admission gate pods that nothing releases.
        leads = self.leading.is_set() and not acquire
        annotations[GATES_ANNOTATION] = (self.health() or "ok") if leads else ACQUIRING
        metadata["annotations"] = annotations
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }

    def _observe(self, lease: dict[str, Any], now: float, wall: float) -> None:
        self._cached = lease
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        self._observed = _record(lease)
        self._observed_at, self._observed_wall = now, wall
        seconds = spec.get("leaseDurationSeconds")
        self._observed_seconds = float(seconds) if isinstance(seconds, int) else 0.0
        self._holder = holder
        said = ((lease.get("metadata") or {}).get("annotations") or {}).get(GATES_ANNOTATION)
        self._gates = said if isinstance(said, str) and said != "ok" else ""

    def release(self) -> bool:
        """Give the Lease up (client-go's ``tryRelease``): holder empty, 1 s duration. On a
        stop, so each call may take a retry period: a release that cannot land by then is
        left to lapse."""
        if not self.leading.is_set():
            return True
        self.fence.close()  # nothing acts once the Lease may be another's
        cfg = self.config
        try:
            lease = self._get(timeout=cfg.retry_period)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != cfg.identity:
                return True
            stamp = _micro_time(self.wall())
            old = lease.get("spec") or {}
            body = dict(lease)
            body["spec"] = {
                "leaseDurationSeconds": 1,
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": int(old.get("leaseTransitions") or 0),
            }
            replace = self.api.replace_namespaced_lease
            self._call(replace, cfg.name, cfg.namespace, body, timeout=cfg.retry_period)
        except Exception as err:
            log.warning("cannot release Lease %s/%s: %s", cfg.namespace, cfg.name, _short(err))
            return False
        self.leading.clear()
        self._holder = ""
        self.publish(self.state())
        return True

    # --- the loop ---------------------------------------------------------------------------
    def run(self, stop: threading.Event, on_lost: Callable[[], None] = lambda: None) -> None:
        """Acquire, then renew every retry period; stop leading (``on_lost``) once the
        fence passed with no renewal (``renew_deadline`` after the last one started).
        Returns when ``stop`` is set, after releasing the Lease if it led."""
        cfg = self.config
        while not stop.is_set() and not self.fence.closed:  # a leader lost is done
            ok = self.try_acquire_or_renew()
            if ok and self.fence.holds():
                if not self.leading.is_set():
                    log.info("leading", extra={"lease": f"{cfg.namespace}/{cfg.name}"})
                    self.leading.set()
            elif self.leading.is_set() and not self.fence.holds():
                self.lose(on_lost)
            self.publish(self.state())
            stop.wait(cfg.retry_period)
        self.release()

    def lose(self, on_lost: Callable[[], None] = lambda: None) -> None:
        """Stop leading: the fence closes, the note says so, ``on_lost`` is told."""
        self.fence.close()
        if self.leading.is_set():
            log.warning("lost the Lease: no renewal within %.1fs", self.config.renew_deadline)
            self.leading.clear()
            self.publish(self.state())
        on_lost()

    def state(self) -> LeaderState:
        leader = self.leading.is_set()
        return LeaderState(
            enabled=True,
            leader=leader,
            identity=self.config.identity,
            holder=self._holder,
            renewed_at=self._observed_wall,
            written_at=self.wall(),
            lease_seconds=self._observed_seconds or self.config.lease_seconds,
            gates=self.health() if leader else self._gates,
        )

    # --- the API, as raw JSON ---------------------------------------------------------------
    def _get(self, timeout: float | None = None) -> dict[str, Any] | None:
        cfg = self.config
        try:
            resp = self._call(
                self.api.read_namespaced_lease, cfg.name, cfg.namespace, timeout=timeout
            )
        except Exception as err:
            if getattr(err, "status", None) == 404:
                return None
            raise
        return resp

    def _call(
        self, method: Callable[..., Any], *args: Any, timeout: float | None = None
    ) -> dict[str, Any]:
        timeout = self._timeout() if timeout is None else timeout
        if timeout <= 0:
            raise TimeoutError("the renew deadline passed")
        resp = method(*args, _preload_content=False, _request_timeout=(timeout, timeout))
        result: dict[str, Any] = json.loads(resp.data)
        return result


def _short(err: Exception) -> str:
    status = getattr(err, "status", None)
    return f"HTTP {status}" if status else f"{type(err).__name__}: {err}"
