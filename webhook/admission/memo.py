"""Answers remembered per object template, so the N pods of one Job cost one policy run.

A Job with parallelism 1000 sends 1000 pod admissions that differ only in per-object
identity (name, uid, completion index); the Jobs of one CronJob differ the same way. The
policy's answer depends on none of those fields, so the engine keys its verdicts on the
object *without* them and answers a repeat from memory: a key and a dict lookup instead
of copy, mutate and diff (``make bench`` measures both paths).

What makes a remembered verdict correct for a new object:

- The key holds everything the mutation reads. For a Job or a Pod that is its view
  (``webhook.kinds.view``): the mutator runs on the view alone, so every object with the same
  view gets the same answer by construction, and Jobs that differ in names, images,
  arguments or env values (a pipeline's runs, one manifest applied under new names) share
  one entry. For other kinds it is the whole object (serialised) minus ``IGNORED_*``
  below, which no mutator reads and no patch touches (a property test varies them and
  checks the verdict never changes). Either way the key adds endpoint, operation,
  namespace and the identity of the config and attempt source (a reloaded config is a
  new object, so nothing computed under the old one is served).
- Lookups made during the mutation (the attempt cache: how many times has this Job
  failed?) are recorded with their answers; a hit replays them and is used only when
  every answer is the same, so a pod admitted after one more failure is computed afresh.
- Only allowed-or-denied verdicts of a completed run are kept; an internal error is not.

Bounded: objects (or views) over ``MAX_KEY_BYTES`` are never remembered (their serialisation would
cost more than it saves), and the oldest entries go first past ``MAX_ENTRIES``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from webhook.admission.review import Verdict
from webhook.cluster.attempts import AttemptLookup
from webhook.cluster.facts import ClusterFacts
from webhook.cluster.history import HistoryKey, HistoryLookup
from webhook.cluster.leadership import Clock, GateReleases, LeaderLive, Now, Passed
from webhook.cluster.limits import LimitLookup, LimitQuestion
from webhook.cluster.nodes import NodeAnswer
from webhook.kube.scheduling import Placement
from webhook.kube.wellknown import (
    COMPLETION_INDEX,
    CRONJOB_SCHEDULED_TIMESTAMP,
    LAST_APPLIED,
    POD_INDEX_LABEL,
)

#: Per-object identity the API server or a controller gives each object of one template.
IGNORED_METADATA = frozenset(
    {"name", "generateName", "uid", "creationTimestamp", "resourceVersion", "generation"}
)
#: Per-pod or per-run labels and annotations set by the Job, StatefulSet and CronJob
#: controllers (our attempt sources, e.g. ``job-index-failure-count``, are not here).
IGNORED_LABELS = frozenset({COMPLETION_INDEX, POD_INDEX_LABEL})
IGNORED_ANNOTATIONS = frozenset({COMPLETION_INDEX, CRONJOB_SCHEDULED_TIMESTAMP})
#: An Indexed Job's pods are named ``<job>-<index>`` in ``spec.hostname``.
IGNORED_POD_SPEC = frozenset({"hostname"})

MAX_KEY_BYTES = 64 * 1024
MAX_ENTRIES = 256


def fingerprint(obj: Mapping[str, Any], kind: str) -> bytes | None:
    """The object as the policy sees it, serialised; ``None`` when it cannot be a key:
    too large, not serialisable, or written by a person with ``kubectl apply`` (its
    last-applied record names it, so no other object can repeat it: computing a key
    would only cost time)."""
    view = dict(obj)
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        annotations = metadata.get("annotations")
        if isinstance(annotations, dict) and LAST_APPLIED in annotations:
            return None
        meta = {k: v for k, v in metadata.items() if k not in IGNORED_METADATA}
        for name, ignored in (("labels", IGNORED_LABELS), ("annotations", IGNORED_ANNOTATIONS)):
            values = meta.get(name)
            if isinstance(values, dict) and not ignored.isdisjoint(values):
                meta[name] = {k: v for k, v in values.items() if k not in ignored}
        view["metadata"] = meta
    spec = obj.get("spec")
    if kind == "Pod" and isinstance(spec, dict) and not IGNORED_POD_SPEC.isdisjoint(spec):
        view["spec"] = {k: v for k, v in spec.items() if k not in IGNORED_POD_SPEC}
    try:
        key = orjson.dumps(view)
    except (TypeError, orjson.JSONEncodeError):
        return None
    return key if len(key) <= MAX_KEY_BYTES else None


def view_key(view: Mapping[str, Any]) -> bytes | None:
    """A view (``webhook.kinds.view``), serialised, as a key; ``None`` when it cannot be one."""
    try:
        key = orjson.dumps(view)
    except (TypeError, orjson.JSONEncodeError):
        return None
    return key if len(key) <= MAX_KEY_BYTES else None


#: A lookup made during a policy run and its answer: a Job's failures (the question is
#: (namespace, name, uid)), a lineage's failure history (the question is its key), a
#: namespace's LimitRanges (``LimitQuestion``), whether a node remains for a pod's
#: placement (``Placement``), and what a retry-delay gate asks of leadership and time
#: (``LeaderLive``, ``GateReleases``, ``Passed``, ``Now``: a remembered gate is not
#: replayed once a controller stopped leading or releasing, or the delay ran out).
Call = tuple[Any, Any]
CLOCK_QUESTIONS = (LeaderLive, GateReleases, Passed, Now)


def ask(source: ClusterFacts, question: Any, clock: Any = None) -> Any:
    """Ask ``source`` (or ``clock``, for leadership and time) a recorded question again."""
    if isinstance(question, CLOCK_QUESTIONS):
        return (clock if clock is not None else Clock()).ask(question)
    if isinstance(question, HistoryKey):
        return source.job_history(question)
    if isinstance(question, LimitQuestion):
        return source.limit_ranges(question.namespace)
    if isinstance(question, Placement):
        return source.placement(question)
    namespace, name, uid = question
    return source.job_failures(namespace, name, uid)


class RecordingAttempts:
    """The cluster's facts (``ClusterFacts``), remembering what they were asked and
    answered."""

    def __init__(self, source: ClusterFacts):
        self.source = source
        self.calls: list[Call] = []

    def job_failures(self, namespace: str, name: str, uid: str) -> AttemptLookup:
        answer = self.source.job_failures(namespace, name, uid)
        self.calls.append(((namespace, name, uid), answer))
        return answer

    def job_history(self, key: HistoryKey) -> HistoryLookup:
        answer = self.source.job_history(key)
        self.calls.append((key, answer))
        return answer

    def limit_ranges(self, namespace: str) -> LimitLookup:
        answer = self.source.limit_ranges(namespace)
        self.calls.append((LimitQuestion(namespace), answer))
        return answer

    def placement(self, question: Placement) -> NodeAnswer:
        answer = self.source.placement(question)
        self.calls.append((question, answer))
        return answer

    def stats(self) -> dict[str, Any]:
        return self.source.stats()

    def clocked(self, clock: Any) -> RecordingClock:
        """``clock``, its answers recorded among this run's lookups."""
        return RecordingClock(clock, self.calls)


class RecordingClock:
    """A clock (``webhook.cluster.leadership.Clock``) whose answers are recorded."""

    def __init__(self, clock: Any, calls: list[Call]):
        self.clock = clock
        self.calls = calls

    def ask(self, question: Any) -> Any:
        answer = self.clock.ask(question)
        self.calls.append((question, answer))
        return answer


@dataclass(frozen=True)
class _Entry:
    verdict: Verdict
    lookups: tuple[Call, ...]
    #: Held so that the ids in the key cannot be reused by new objects while cached.
    pinned: tuple[Any, ...]


class Memo:
    def __init__(self, max_entries: int = MAX_ENTRIES):
        self.max_entries = max_entries
        # Ordered for O(1) eviction of the oldest (a plain dict's first key is found by
        # skipping the holes that deletions leave at its front).
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple, attempts: ClusterFacts, clock: Any = None) -> Verdict | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        for question, answer in entry.lookups:
            if ask(attempts, question, clock) != answer:
                self.misses += 1
                return None
        self.hits += 1
        return entry.verdict

    def put(
        self,
        key: tuple,
        verdict: Verdict,
        lookups: list[Call],
        pinned: tuple[Any, ...],
    ) -> None:
        if self.max_entries <= 0:  # turned off (``serve --memo-entries 0``)
            return
        with self._lock:
            while len(self._entries) >= self.max_entries:
                self._entries.popitem(last=False)
            self._entries[key] = _Entry(verdict, tuple(lookups), pinned)

    def clear(self) -> None:
        """Forget every entry, and the counts."""
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> dict[str, int]:
        return {"entries": len(self), "hits": self.hits, "misses": self.misses}
