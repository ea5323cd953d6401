"""Who leads the controller, as the admission workers of this replica see it.

The controller (``webhook.controller``) runs in a process of its own beside the admission
workers; it holds or watches the ``coordination.k8s.io/v1`` Lease and writes what it sees
into a few bytes of memory shared across the fork (``LeaderNote``). Workers read it, with
no request to the API, for ``/readyz``, metrics, and the one admission decision that
depends on a live controller: a pod is given a retry-delay scheduling gate only while
some replica's controller has renewed the Lease recently (``recently_renewed``) *and* the
leader says its gate releases work (``gates``), so that a gate is never added that no
controller would remove. The leader tells the second in a note on the Lease it renews
(``webhook.controller.lease``): every replica's controller reads the Lease anyway, so
standbys learn it with no request of their own.
"""

from __future__ import annotations

import json
import mmap
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class LeaderState:
    """What this replica's controller last saw of the Lease.

    ``written_at`` is when it wrote this (wall clock): a note that stops being written
    means the controller process is gone, and then nothing is known. ``renewed_at`` is
    when the Lease was last seen renewed (by this replica when it leads, else when a
    standby last saw the leader's record change: the observation time, as client-go's
    leader election uses, not the Lease's own ``renewTime``, so clock skew between
    replicas does not matter)."""

    enabled: bool = False
    leader: bool = False
    identity: str = ""
    holder: str = ""
    renewed_at: float = 0.0
    written_at: float = 0.0
    lease_seconds: float = 15.0
    reason: str = ""
    #: Why the leader's retry-delay gates are not being released now ("" while they are:
    #: ``webhook.controller.gates.GateReleaser.health``), as the leader last said.
    gates: str = ""

    def recently_renewed(self, now: float | None = None) -> bool:
        """Whether a controller (this replica's or another's) holds a live Lease, as far as
        this replica's controller, itself alive, can tell."""
        now = time.time() if now is None else now
        if not self.enabled or now - self.written_at > self.lease_seconds:
            return False
        return bool(self.holder) and now - self.renewed_at <= self.lease_seconds

    def summary(self, now: float | None = None) -> dict[str, object]:
        """For ``/readyz``: whether this replica leads, who does, and whether the Lease
        is live."""
        if not self.enabled:
            return {"enabled": False, "reason": self.reason or "off"}
        return {
            "enabled": True,
            "leader": self.leader,
            "identity": self.identity,
            "holder": self.holder or None,
            "leaseLive": self.recently_renewed(now),
            "gateReleases": self.gates or "ok",
        }


class LeaderNote:
    """A ``LeaderState`` in anonymous shared memory: the supervisor makes it before it
    forks, the controller process writes it, every worker reads it."""

    SIZE = 1024

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, self.SIZE)

    def write(self, state: LeaderState) -> None:
        data = json.dumps(asdict(state)).encode()[: self.SIZE - 4]
        self._map[4 : 4 + len(data)] = data
        self._map[0:4] = struct.pack("I", len(data))

    def read(self) -> LeaderState:
        (size,) = struct.unpack("I", self._map[0:4])
        if not size:
            return LeaderState(reason="the controller has not started")
        try:
            return LeaderState(**json.loads(self._map[4 : 4 + min(size, self.SIZE - 4)]))
        except (ValueError, TypeError):  # read mid-write: as good as not yet written
            return LeaderState(reason="the controller's note is being written")


class NoLeader:
    """Where no controller runs (dry-run, ``--no-controller``, no cluster)."""

    def __init__(self, reason: str = "off") -> None:
        self.reason = reason

    def read(self) -> LeaderState:
        return LeaderState(reason=self.reason)


class LeaderSource(Protocol):
    def read(self) -> LeaderState: ...


# --- what an admission asks of leadership and time ------------------------------------------
#
# A pod's retry-delay gate depends on whether a controller leads (a gate nobody removes
# must never be added) and on the time (a delay already over needs no gate). Both are
# questions asked through ``Clock``, so that the remembered-verdict memo can record them
# with their answers and replay them (``webhook.admission.memo``): a verdict reached
# under another leadership, or before a delay ran out, is computed afresh.


@dataclass(frozen=True)
class LeaderLive:
    """Does a controller lead: has a replica renewed the Lease recently?"""


@dataclass(frozen=True)
class GateReleases:
    """Does the leader release gates? "" when it does, else why not (its own words)."""


@dataclass(frozen=True)
class Passed:
    """Has the time ``at`` (Unix time) come?"""

    at: float


@dataclass(frozen=True)
class Now:
    """The time now, in whole seconds (a delay counted from admission starts here)."""


ClockQuestion = LeaderLive | GateReleases | Passed | Now


def wall() -> float:
    """The wall clock (Unix time): what not-before is written and compared in."""
    return time.time()


class Clock:
    """Answers ``ClockQuestion``s from this replica's leadership note and the wall clock."""

    def __init__(
        self,
        leadership: LeaderSource | None = None,
        now: Callable[[], float] | None = None,
    ):
        self.leadership = leadership if leadership is not None else NoLeader()
        self.now = now if now is not None else wall

    def ask(self, question: ClockQuestion) -> Any:
        if isinstance(question, LeaderLive):
            return self.leadership.read().recently_renewed(self.now())
        if isinstance(question, GateReleases):
            return self.leadership.read().gates
        if isinstance(question, Passed):
            return self.now() >= question.at
        return int(self.now())
