"""The cluster's Nodes, to tell whether a pod kept off failed nodes has somewhere to run.

``avoid-failed-nodes`` makes the exclusion of the failed nodes a requirement only while
some other Ready node remains that the pod's own placement allows
(``webhook.kube.scheduling``); otherwise a preference, so that the pod is never left
Pending for want of a node (``webhook.kinds.pod``). The question is answered from a
watch-backed cache of what placement reads of each Node (name, labels, the taints the
scheduler filters on, cordoned, Ready), never with a request per pod.

The cache starts with the first question (a cluster whose workloads never avoid failed
nodes never watches Nodes), and the first questions wait for its first list at most a
lookup timeout from its start; until then, or when Nodes cannot be listed (RBAC, an API
outage), the answer is unknown and the exclusion is a preference. Answers are kept per
question until a Node changes in what placement reads (a heartbeat does not count), so
many pods of one template cost one pass over the nodes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.cluster.informer import ListedWhole
from webhook.kube.scheduling import Placement, fits, node_of

log = logging.getLogger(__name__)

#: Answers kept (questions differ by their placement rules and failed nodes).
MAX_ANSWERS = 4096
#: Up to this many Nodes a new question is worked out on the event loop; past it, on a
#: thread (a pass costs microseconds a node, and the loop serves every other request).
AT_ONCE_NODES = 500


@dataclass(frozen=True)
class NodeAnswer:
    """Whether a node remains for the pod (``fits``); ``known`` false when that cannot be
    told (``reason`` says why)."""

    known: bool
    fits: bool = False
    reason: str = ""


#: What a process that reads no Nodes answers (the offline CLI, ``status``).
NO_NODES = NodeAnswer(False, reason="no Nodes are read here")


class NodeCache(ListedWhole):
    """Watch-backed Nodes, reduced to what placement reads; started by the first question."""

    def __init__(self, core_api: Any, lookup_timeout: float = 0.5):
        super().__init__("nodes", core_api.list_node, "node cache")
        self.lookup_timeout = lookup_timeout
        #: (``_objects``: node name -> ``Node``.) Question -> answer, for the Nodes as
        #: they are (cleared when one changes).
        self._answers: dict[Placement, NodeAnswer] = {}
        #: Counts the changes that cleared the answers: one worked out over Nodes that
        #: changed meanwhile is not kept.
        self._generation = 0
        self._counters = {"questions": 0, "evaluated": 0, "unknown": 0}

    # --- store updates (informer thread, lock held) ----------------------------------
    def _store(self, store: dict[Any, Any], kind: str, obj: Mapping[str, Any]) -> Any:
        node = node_of(obj)
        if node is None:
            return None
        if kind == "DELETED":
            return node.name if store.pop(node.name, None) is not None else None
        if store.get(node.name) == node:
            return None  # a heartbeat: nothing placement reads changed
        store[node.name] = node
        return node.name

    def _refresh(self, keys: set[Any] | None) -> None:
        self._answers.clear()
        self._generation += 1

    # --- questions -------------------------------------------------------------------
    def placement(self, question: Placement) -> NodeAnswer:
        """The answer, waiting for the first list at most ``lookup_timeout`` from the
        cache's start (only the first questions can wait)."""
        answer = self.answer_at_once(question)
        if answer is not None:
            return answer
        informer = self._informers[0]
        informer.synced.wait(max(0.0, self._started_at + self.lookup_timeout - time.monotonic()))
        return self._answer(question)

    def answer_at_once(self, question: Placement) -> NodeAnswer | None:
        """The answer when it needs no wait: kept from before, or worked out over a few
        Nodes, or unknown (not listed after a lookup timeout, or the list failed); ``None``
        while the first list may still come in time, or when a pass over many Nodes is
        due (then ``placement`` gives it, on a thread). Starts the cache."""
        if not self.started:
            self.start()
        informer = self._informers[0]
        waiting = time.monotonic() < self._started_at + self.lookup_timeout
        if not informer.synced.is_set() and waiting and not informer.last_error:
            return None
        with self._lock:
            known = self._answers.get(question)
            many = len(self._objects) > AT_ONCE_NODES
        if known is None and many and informer.synced.is_set():
            return None
        return self._answer(question)

    def _answer(self, question: Placement) -> NodeAnswer:
        self._counters["questions"] += 1
        informer = self._informers[0]
        if not informer.synced.is_set():
            self._counters["unknown"] += 1
            why = informer.last_error or "not listed yet"
            return NodeAnswer(False, reason=f"Nodes unreadable: {why}")
        with self._lock:
            known = self._answers.get(question)
            if known is not None:
                return known
            nodes, generation = list(self._objects.values()), self._generation
        self._counters["evaluated"] += 1
        answer = NodeAnswer(True, any(fits(node, question) for node in nodes))
        with self._lock:
            if len(self._answers) >= MAX_ANSWERS:
                self._answers.clear()
            if generation == self._generation:
                self._answers[question] = answer
        return answer

    def stats(self) -> dict[str, Any]:
        with self._lock:
            count = len(self._objects)
        return {
            "started": self.started,
            "synced": self.synced,
            "nodes": count,
            "watch_errors": sum(i.errors for i in self._informers),
            **self._counters,
        }
