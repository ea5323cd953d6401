"""A workload's failure history, kept on the workload itself (``retry-policy.dev/history``).

Each replica's admission workers learn failures from their own watch of failed pods
(``webhook.cluster.history``), and so know nothing of pods deleted before they started:
a JobSet's restart deletes its failed pods, PodGC and a finished Job's TTL delete others.
Two replicas could then answer one pod differently (one raises its memory, the other,
started after the restart, does not). The leading controller writes what a decision
needs onto the workload the pods belong to (the Job; the JobSet for a JobSet's or a
TrainJob's pods, as a restart recreates the child Jobs), and every replica reads it from
the watch it already has of those workloads: restarted or new, all decide the same, and
no deletion of pods loses anything.

The record is small and bounded (``MAX_LINEAGES``, ``MAX_NODES``, ``MAX_MARKS``: under
8 KiB as written), only the controller writes it (with the ``resourceVersion`` it read as
a precondition), and it is merged with what a worker saw itself, so a decision made
between a failure and its record (the controller writes within a second or two) still
counts it when that worker saw the failure. The replacement pod usually comes after the
record, held back by the Job controller's back-off (10 s and up), but nothing guarantees
it: that back-off is kept only in the leading kube-controller-manager's memory (a restart
or a new leader creates the replacement at once: ``backoffStore`` in
pkg/controller/job/backoff_utils.go) and per Job (a JobSet's restart makes new child Jobs,
whose pods come at once). A worker that saw neither the failed pod nor the record then
decides without it, and says so where it can (a JobSet pod's warning).

Merging is idempotent: per container the most OOM kills and the largest memory killed at,
the union of failed nodes, the later last failure. A failure seen both in the record and
in a worker's own watch is counted once for memory and nodes (a maximum and a union), and
the record's marks keep the controller from recording one pod twice.

The annotation, as ``kubectl get job -o yaml`` shows it::

    retry-policy.dev/history: '{"v":1,"lineages":{"":{"counted":2,"ignored":1,
      "oomKills":[["trainer",2,2147483648,2147483648]],"nodes":["node-a"],
      "last":["oom-killed:trainer","2026-11-26T10:00:00Z"]}},"run":0,"pods":"..."}'

Lineages: ``""`` for a Job's pods, the completion index (``"3"``) for an Indexed Job's;
for a JobSet's, ``"<replicated Job>/<job index>"`` (then ``/<completion index>``), across
its runs; ``run`` is the latest JobSet run (``restart-attempt``) with a recorded failure.

Disruptions (``max-disruptions``, ``webhook.controller.disruptions``): the disrupted pods
the controller counted, per lineage (``"disruptions": {"": 3}``), and which of them were
free and which over the budget (``"disrupted"``, ``"overBudget"``: marks, as ``pods``). The
count is kept here, on the workload, because nothing else holds it: ignored failures
never enter the Job's ``status.failed``, a disrupted pod is deleted once the Job
controller has judged it, a JobSet's restart deletes its child Jobs, and the controller
that counted may be another replica's by the next disruption. The marks make a count
survive a restart of the controller between the condition it added and the count it
wrote: a pod marked over the budget gets its condition again, one marked free nothing,
and a pod marked neither is counted anew from the count as written.

A pod over the budget that had failed before its condition could land (the kubelet's and
PodGC's disruptions arrive with ``Failed``) is counted another way, once: ``late`` marks
it when the controller lowered the Job's ``backoffLimit`` for it (``lateOther`` when its
rules counted it, or nothing could be lowered), and ``lowered`` says by how much in all,
each mark and its one lowering written in the same patch.

An audited workload (``retry-policy.dev/audit``: ``webhook.plan.audit``) keeps, under
``"audit"``, what the replay of its failures needs (``"tries"``: the first ``MAX_TRIES``
failed attempts, about 200 to 300 bytes each: ``webhook.cluster.tries``; ``"more"``: how many
were not kept) and whether its ``RetryPolicyAudit`` was told (``"told"``: once, by
``webhook.controller.audits``, which writes it before the Event).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import functools
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from webhook.cluster.events import WorkloadKind
from webhook.cluster.history import (
    MARK,
    MAX_NODES,
    HistoryKey,
    HistoryLookup,
    Killed,
    failed_node,
    failure_cause,
    jobset_place,
    jobset_run,
    killed_at,
    marked,
    parse_time,
    pod_mark,
)
from webhook.cluster.informer import Informer, Informers
from webhook.cluster.tries import MAX_TRIES, Try
from webhook.kube.wellknown import COMPLETION_INDEX

ANNOTATION = "retry-policy.dev/history"
VERSION = 1
#: Bounds: lineages kept (the ones that failed most recently), and pods remembered as
#: recorded (6-byte marks; past this, the oldest go: a pod recorded that long ago is gone
#: from the watch in all but extreme cases, and a second count of it would change only
#: the counts shown, never a raise or an avoided node).
MAX_LINEAGES = 64
MAX_MARKS = 512
#: Disrupted pods remembered (each of the two kinds), and lineages with a disruption
#: count (past this, the count goes to ``OVERFLOW``: it counts for the whole workload, not
#: for the index).
MAX_DISRUPTED_MARKS = 256
MAX_DISRUPTION_LINEAGES = 4096
OVERFLOW = "*"


@dataclass(frozen=True)
class Lineage:
    """What a decision needs of one lineage's failures."""

    counted: int = 0
    ignored: int = 0
    oom_kills: tuple[Killed, ...] = ()
    nodes: tuple[str, ...] = ()
    last_cause: str = ""
    last_failed_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"counted": self.counted, "ignored": self.ignored}
        if self.oom_kills:
            out["oomKills"] = [k.to_json() for k in self.oom_kills]
        if self.nodes:
            out["nodes"] = list(self.nodes)
        if self.last_cause or self.last_failed_at is not None:
            out["last"] = [self.last_cause, _rfc3339(self.last_failed_at)]
        return out

    @classmethod
    def from_json(cls, data: Any) -> Lineage:
        if not isinstance(data, dict):
            return cls()
        kills = []
        for item in data.get("oomKills") or ():
            if (
                isinstance(item, list)
                and len(item) == 4
                and isinstance(item[0], str)
                and _count(item[1])
                and all(v is None or _count(v) for v in item[2:])
            ):
                kills.append(Killed(item[0], item[1], item[2], item[3]))
        nodes = tuple(n for n in data.get("nodes") or () if isinstance(n, str))[-MAX_NODES:]
        last = data.get("last")
        cause, when = "", None
        if isinstance(last, list) and len(last) == 2 and isinstance(last[0], str):
            cause, when = last[0], parse_time(last[1])
        return cls(
            data["counted"] if _count(data.get("counted")) else 0,
            data["ignored"] if _count(data.get("ignored")) else 0,
            tuple(sorted(kills)),
            nodes,
            cause,
            when,
        )

    def add(self, pod: Mapping[str, Any], counted: bool) -> Lineage:
        """This lineage with one more failed pod."""
        kills = {k.container: k for k in self.oom_kills}
        for kill in killed_at(pod):
            before = kills.get(kill.container)
            if before is not None:
                kill = Killed(
                    kill.container,
                    before.kills + 1,
                    _most(before.request, kill.request),
                    _most(before.limit, kill.limit),
                )
            kills[kill.container] = kill
        nodes = self.nodes
        node = failed_node(pod)
        if node is not None:
            nodes = (*(n for n in nodes if n != node), node)[-MAX_NODES:]
        cause, when = failure_cause(pod)
        last_cause, last_at = self.last_cause, self.last_failed_at
        if last_at is None or (when is not None and when >= last_at):
            last_cause, last_at = cause, when
        return Lineage(
            self.counted + int(counted),
            self.ignored + int(not counted),
            tuple(sorted(kills.values())),
            nodes,
            last_cause,
            last_at,
        )


@dataclass(frozen=True)
class Record:
    """The record on one workload."""

    lineages: dict[str, Lineage] = field(default_factory=dict)
    run: int = -1
    marks: bytes = b""
    #: Disruptions the controller counted, by lineage (see the module's doc).
    disruptions: dict[str, int] = field(default_factory=dict)
    #: Disrupted pods counted free, and over the budget.
    free: bytes = b""
    over: bytes = b""
    #: Pods over the budget that had failed unmarked, settled once (``add_late``): those
    #: the controller lowered the Job's backoffLimit for, the others, and how much it
    #: lowered it in all.
    late: bytes = b""
    late_other: bytes = b""
    lowered: int = 0
    #: An audited workload's failed attempts, for its replay (``webhook.cluster.tries``):
    #: the first ``MAX_TRIES``, and how many more were recorded; and whether its
    #: ``RetryPolicyAudit`` was told (``webhook.controller.audits``).
    tries: tuple[Try, ...] = ()
    more_tries: int = 0
    told: bool = False
    #: Free failures (``free-categories``) the controller counted against
    #: ``max-free-failures``, by lineage, and which pods were free and which over
    #: (``webhook.controller.freebudget``), kept as the disruptions are.
    free_failures: dict[str, int] = field(default_factory=dict)
    freed: bytes = b""
    free_over: bytes = b""

    # --- reading -------------------------------------------------------------------------
    @classmethod
    def parse(cls, raw: Any) -> Record | None:
        """The record in an annotation's value; ``None`` when there is none or it cannot
        be read (a record of a later version, or edited by hand: it is then rewritten)."""
        if not isinstance(raw, str) or not raw:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("v") != VERSION:
            return None
        lineages = data.get("lineages")
        try:
            marks = base64.b64decode(data.get("pods") or "", validate=True)
        except (binascii.Error, ValueError, TypeError):
            marks = b""
        run = data.get("run")
        counts = data.get("disruptions")
        return cls(
            {
                k: Lineage.from_json(v)
                for k, v in (lineages.items() if isinstance(lineages, dict) else ())
                if isinstance(k, str)
            },
            run if isinstance(run, int) and not isinstance(run, bool) else -1,
            marks[: len(marks) - len(marks) % MARK],
            _counts(counts),
            _marks(data.get("disrupted")),
            _marks(data.get("overBudget")),
            _marks(data.get("late")),
            _marks(data.get("lateOther")),
            data["lowered"] if _count(data.get("lowered")) else 0,
            *_tries(data.get("audit")),
            _counts(data.get("freeFailures")),
            _marks(data.get("freed")),
            _marks(data.get("freeOver")),
        )

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Record | None:
        return cls.parse(text_of(obj))

    def seen(self, pod_uid: str) -> bool:
        return marked(self.marks, pod_mark(pod_uid))

    def disrupted(self, pod_uid: str) -> str | None:
        """Whether a disrupted pod was counted: "free", "over" (the budget), or ``None``."""
        mark = pod_mark(pod_uid)
        if marked(self.over, mark):
            return "over"
        return "free" if marked(self.free, mark) else None

    def settled(self, pod_uid: str) -> bool:
        """Whether a pod over the budget that failed unmarked was settled: counted
        another way, or found not countable (``late_lowered`` tells which)."""
        mark = pod_mark(pod_uid)
        return marked(self.late, mark) or marked(self.late_other, mark)

    def late_lowered(self, pod_uid: str) -> bool | None:
        """For such a pod, whether the Job's backoffLimit was lowered for it (``None``:
        not such a pod)."""
        if not self.settled(pod_uid):
            return None
        return marked(self.late, pod_mark(pod_uid))

    def add_late(self, pod_uid: str, lowered: bool) -> Record:
        """This record with one more such pod, and the backoffLimit one lower if
        ``lowered`` (unchanged when it holds that pod)."""
        if not pod_uid or self.settled(pod_uid):
            return self
        keep, mark = MAX_DISRUPTED_MARKS * MARK, pod_mark(pod_uid)
        if lowered:
            return replace(self, late=(self.late + mark)[-keep:], lowered=self.lowered + 1)
        return replace(self, late_other=(self.late_other + mark)[-keep:])

    def disruptions_of(self, lineage: str | None = None) -> int:
        """Disruptions counted: the workload's (``None``), or one lineage's."""
        if lineage is None:
            return sum(self.disruptions.values())
        return self.disruptions.get(lineage, 0)

    def add_disruption(self, pod: Mapping[str, Any], over: bool) -> Record:
        """This record with one more disrupted pod, free or ``over`` the budget (unchanged
        when it counted that pod already)."""
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid or self.disrupted(uid) is not None:
            return self
        key = lineage_key(meta)
        counts = dict(self.disruptions)
        if key not in counts and len(counts) >= MAX_DISRUPTION_LINEAGES:
            key = OVERFLOW
        counts[key] = counts.get(key, 0) + 1
        mark = pod_mark(uid)
        free, over_ = (self.free, self.over + mark) if over else (self.free + mark, self.over)
        keep = MAX_DISRUPTED_MARKS * MARK
        return replace(self, disruptions=counts, free=free[-keep:], over=over_[-keep:])

    def free_of(self, lineage: str | None = None) -> int:
        """Free failures counted: the workload's (``None``), or one lineage's."""
        if lineage is None:
            return sum(self.free_failures.values())
        return self.free_failures.get(lineage, 0)

    def freed_as(self, pod_uid: str) -> str | None:
        """Whether a free failure was counted: "free", "over" (the budget), or ``None``."""
        mark = pod_mark(pod_uid)
        if marked(self.free_over, mark):
            return "over"
        return "free" if marked(self.freed, mark) else None

    def add_free(self, pod: Mapping[str, Any], over: bool, lineage: str | None) -> Record:
        """This record with one more free failure in ``lineage`` (``None``: the
        workload's), within the budget or ``over`` it (unchanged when it holds that pod)."""
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid or self.freed_as(uid) is not None:
            return self
        key = lineage if lineage is not None else ""
        counts = dict(self.free_failures)
        if key not in counts and len(counts) >= MAX_DISRUPTION_LINEAGES:
            key = OVERFLOW
        counts[key] = counts.get(key, 0) + 1
        mark, keep = pod_mark(uid), MAX_DISRUPTED_MARKS * MARK
        freed, over_ = (
            (self.freed, self.free_over + mark) if over else (self.freed + mark, self.free_over)
        )
        return replace(self, free_failures=counts, freed=freed[-keep:], free_over=over_[-keep:])

    def counted(self, index: int | None = None, per_index: bool = False) -> int:
        """Counted failures recorded for a Job: all of them, or one index's."""
        if per_index:
            return self.lineages.get(str(index), Lineage()).counted
        return sum(line.counted for line in self.lineages.values())

    # --- writing -------------------------------------------------------------------------
    def add(self, pod: Mapping[str, Any], counted: bool, keep: bool = False) -> Record:
        """This record with one more failed pod (unchanged when it holds that pod); with
        ``keep`` (an audited workload), what its replay needs of it too."""
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid or self.seen(uid):
            return self
        key = lineage_key(meta)
        lineages = dict(self.lineages)
        lineages[key] = lineages.pop(key, Lineage()).add(pod, counted)
        if len(lineages) > MAX_LINEAGES:
            by_age = sorted(lineages, key=lambda k: lineages[k].last_failed_at or 0.0)
            for old in by_age[: len(lineages) - MAX_LINEAGES]:
                del lineages[old]
        run = max(self.run, jobset_run(meta)) if jobset_place(meta) else self.run
        marks = (self.marks + pod_mark(uid))[-MAX_MARKS * MARK :]
        tries, more = self.tries, self.more_tries
        if keep and len(tries) < MAX_TRIES:
            tries = (*tries, Try.of(pod, key))
        elif keep:
            more += 1
        return replace(self, lineages=lineages, run=run, marks=marks, tries=tries, more_tries=more)

    def text(self) -> str:
        data: dict[str, Any] = {
            "v": VERSION,
            "lineages": {k: v.to_json() for k, v in sorted(self.lineages.items())},
        }
        if self.run >= 0:
            data["run"] = self.run
        data["pods"] = base64.b64encode(self.marks).decode()
        if self.disruptions:
            data["disruptions"] = dict(sorted(self.disruptions.items()))
            data["disrupted"] = base64.b64encode(self.free).decode()
            data["overBudget"] = base64.b64encode(self.over).decode()
        if self.late:
            data["late"] = base64.b64encode(self.late).decode()
        if self.late_other:
            data["lateOther"] = base64.b64encode(self.late_other).decode()
        if self.lowered:
            data["lowered"] = self.lowered
        if self.free_failures:
            data["freeFailures"] = dict(sorted(self.free_failures.items()))
            data["freed"] = base64.b64encode(self.freed).decode()
            data["freeOver"] = base64.b64encode(self.free_over).decode()
        if self.tries or self.more_tries or self.told:
            data["audit"] = {"tries": [t.to_json() for t in self.tries]}
            if self.more_tries:
                data["audit"]["more"] = self.more_tries
            if self.told:
                data["audit"]["told"] = True
        return json.dumps(data, separators=(",", ":"))


def text_of(obj: Mapping[str, Any]) -> str | None:
    """The record's annotation on a workload, as written (``None``: none)."""
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    value = annotations.get(ANNOTATION) if isinstance(annotations, dict) else None
    return value if isinstance(value, str) and value else None


@functools.lru_cache(maxsize=4096)
def parsed(text: str) -> Record | None:
    """``Record.parse``, remembered: caches keep each workload's record as written (a
    few hundred bytes, where the parsed record is a few kilobytes: benchmarks/
    controller.py) and parse the ones pods ask about."""
    return Record.parse(text)


def lineage_key(metadata: Mapping[str, Any]) -> str:
    """A pod's lineage within its workload's record (see the module's doc)."""
    annotations = metadata.get("annotations")
    raw = annotations.get(COMPLETION_INDEX) if isinstance(annotations, dict) else None
    index = raw if isinstance(raw, str) and raw.isdigit() and len(raw) < 10 else None
    place = jobset_place(metadata)
    parts = [place[1], place[2]] if place else []
    if index is not None:
        parts.append(index)
    return "/".join(parts)


def merge(local: HistoryLookup, lineage: Lineage | None) -> HistoryLookup:
    """A worker's own answer with the record's lineage (idempotent: see the module's
    doc). The record's counts stand in for failures whose pods the worker never saw."""
    if lineage is None or not local.known:
        return local
    kills = {k.container: k for k in local.oom_kills}
    for kill in lineage.oom_kills:
        mine = kills.get(kill.container)
        kills[kill.container] = (
            kill
            if mine is None
            else Killed(
                kill.container,
                max(kill.kills, mine.kills),
                _most(kill.request, mine.request),
                _most(kill.limit, mine.limit),
            )
        )
    nodes = list(lineage.nodes)
    for node in local.nodes:
        if node in nodes:
            nodes.remove(node)
        nodes.append(node)
    cause, when = local.last_cause, local.last_failed_at
    if lineage.last_failed_at is not None and (when is None or lineage.last_failed_at > when):
        cause, when = lineage.last_cause, lineage.last_failed_at
    return replace(
        local,
        oom_kills=tuple(sorted(kills.values())),
        nodes=tuple(nodes[-MAX_NODES:]),
        failures=max(local.failures, lineage.counted + lineage.ignored),
        source=_with_record(local.source),
        last_cause=cause,
        last_failed_at=when,
    )


RECORD_SOURCE = "the workload's record"


def _with_record(source: str) -> str:
    if RECORD_SOURCE in source:
        return source
    return f"{source} and {RECORD_SOURCE}" if source else RECORD_SOURCE


def _tries(raw: Any) -> tuple[tuple[Try, ...], int, bool]:
    """An audited workload's ``tries``, ``more_tries`` and ``told`` (an entry that cannot
    be read counts among the more)."""
    if not isinstance(raw, dict):
        return (), 0, False
    entries = raw.get("tries") if isinstance(raw.get("tries"), list) else []
    read = [Try.from_json(e) for e in entries]
    tries = tuple(t for t in read if t is not None)
    more = (raw["more"] if _count(raw.get("more")) else 0) + len(read) - len(tries)
    return tries, more, raw.get("told") is True


def _marks(raw: Any) -> bytes:
    try:
        found = base64.b64decode(raw or "", validate=True)
    except (binascii.Error, ValueError, TypeError):
        return b""
    return found[: len(found) - len(found) % MARK]


def _counts(raw: Any) -> dict[str, int]:
    return {
        k: v
        for k, v in (raw.items() if isinstance(raw, dict) else ())
        if isinstance(k, str) and _count(v)
    }


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _most(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _rfc3339(when: float | None) -> str | None:
    if when is None:
        return None
    return dt.datetime.fromtimestamp(when, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


JOBSETS = "jobsets"


class KindRecords(Informers):
    """The records on the objects of a kind declared ``Workload.pod_records`` (a JobSet: a
    JobSet's and a TrainJob's pods find theirs there), from a watch of them started by the
    first pod that asks (a cluster without that kind never watches it). Until it has
    listed, a lookup goes on without the record, as a replica without a controller would."""

    def __init__(self, custom_api: Any, kind: WorkloadKind):
        super().__init__()
        self._lock = threading.Lock()
        #: The object's UID -> its record as written.
        self._records: dict[str, str] = {}

        def list_objects(**kwargs: Any) -> Any:
            return custom_api.list_cluster_custom_object(
                kind.group, kind.version, kind.plural, **kwargs
            )

        self._informers = [
            Informer(
                kind.plural, list_objects, self._reset, self._apply, {}, self._stop, "record cache"
            )
        ]

    def _reset(self) -> None:
        with self._lock:
            self._records.clear()

    def _apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if not isinstance(uid, str):
            return
        record = None if kind == "DELETED" else text_of(obj)
        with self._lock:
            if record is None:
                self._records.pop(uid, None)
            else:
                self._records[uid] = record

    def record(self, uid: str) -> Record | None:
        if not self.started:
            self.start()
        with self._lock:
            text = self._records.get(uid)
        return parsed(text) if text is not None else None

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"records": len(self._records), "synced": self.synced}


def lineage_of(key: HistoryKey) -> str:
    """The record's lineage for a history question (see ``lineage_key``): a JobSet's
    pods ask by ``<set UID>/<replicated Job>/<job index>``, a Job's by its UID."""
    parts = key.lineage.split("/", 1)[1:] if key.jobset else []
    if key.index is not None:
        parts.append(str(key.index))
    return "/".join(parts)
