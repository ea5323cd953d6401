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


class PeerWriter(Protocol):
    """What stops a disrupted pod's peers with one write (a JobSet's: one Job condition
    that restarts the set), instead of one mark per peer."""

    def fail_job(self, pod: Mapping[str, Any], cause: str) -> str | None:
        """``written``, ``decided``, ``stale``, ``gone``, or ``None``: mark the peers instead."""
        ...


#: What makes a kind's ``PeerWriter``: (api_client, workloads, events, writes, clock,
#: services).
PeerWriterType = Callable[..., PeerWriter]
