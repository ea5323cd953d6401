"""What the controller hands a kind's controller behaviour (``KindSpec.peers``...): the
controller's services, declared here as Protocols so that a kind's folder holds what its
controller does without importing ``webhook.controller`` (a layer above it), as Kueue's
jobframework hands a GenericJob its client.

The controller builds ``Services`` from its own (``webhook.controller.kindservices``)
and constructs each kind's part with them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from webhook.cluster.events import Regarding

T = TypeVar("T")


class Persist(Protocol):
    """``webhook.controller.writes.persist``: ``call()`` until it goes through, within
    ``patience`` seconds, its failures kept by ``writes`` (by ``key``)."""

    def __call__(
        self,
        writes: Any,
        key: Hashable,
        call: Callable[[], T],
        regarding: Regarding | None,
        what: str,
        patience: float,
    ) -> T: ...


@dataclass(frozen=True)
class Services:
    """The controller's services a kind's controller behaviour is handed."""

    persist: Persist
    #: ``webhook.controller.ratelimit.critical``: the requests this thread sends meanwhile
    #: wait on the critical bucket.
    critical: Callable[[], contextlib.AbstractContextManager[None]]
    #: ``webhook.controller.records.workload_of``: the workload a Job's pod belongs to.
    workload_of: Callable[[Mapping[str, Any]], Regarding | None]


class PeerWriter(Protocol):
    """What stops a disrupted pod's peers with one write (a JobSet's: one Job condition
    that restarts the set), instead of one mark per peer."""

    def fail_job(self, pod: Mapping[str, Any], cause: str) -> str | None:
        """``written``, ``decided``, ``stale``, ``gone``, or ``None``: mark the peers instead."""
        ...


#: What makes a kind's ``PeerWriter``: (api_client, workloads, events, writes, clock,
#: services).
PeerWriterType = Callable[..., PeerWriter]


class AuditHost(Protocol):
    """What the controller's audit reporter (``webhook.controller.audits``) hands a
    ``WholeAudit``: its lock and clock, its reads and writes, its waiting list."""

    clock: Callable[[], float]
    #: The workloads' reads and record writes (``webhook.controller.records.Workloads``).
    workloads: Any

    @property
    def lock(self) -> contextlib.AbstractContextManager[Any]:
        """Held around ``hold``, ``release`` and ``WholeAudit.ready``."""
        ...

    def hold(self, uid: str, obj: Mapping[str, Any]) -> None:
        """Wait with ``obj`` (its ``kind`` set) until it is ready, then tell it."""
        ...

    def release(self, uid: str) -> None: ...

    def watch(
        self, name: str, listing: Callable[..., Any], apply: Callable[[str, Any], None]
    ) -> bool:
        """Start a watch of its own once the reporter runs: ``False`` when not yet."""
        ...

    def audited(self, metadata: Mapping[str, Any]) -> bool: ...

    def mark_told(self, kind: str, obj: Mapping[str, Any], judge: Callable[..., Any]) -> Any: ...

    def told(
        self, obj: Mapping[str, Any], regarding: Regarding | None, note: str, result: Any
    ) -> None: ...


class WholeAudit(Protocol):
    """A kind whose child Jobs are audited with it, as a whole, once it ends (a JobSet's):
    the reporter hands it their Jobs and waits with it as it says."""

    kind: str

    def child(self, event: str, job: Mapping[str, Any], owner_uid: str) -> None: ...

    def ready(self, obj: Mapping[str, Any]) -> bool:
        """Whether its record holds what its child Jobs counted (lock held)."""
        ...

    def tell(self, obj: Mapping[str, Any]) -> Any: ...

    def regarding(self, obj: Mapping[str, Any]) -> Regarding | None: ...


#: What makes a kind's ``WholeAudit``: (host: ``AuditHost``).
WholeAuditType = Callable[[AuditHost], WholeAudit]
