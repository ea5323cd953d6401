"""``retry-webhook status``: a running or finished workload's story between attempts.

It reads the workload, its Jobs and pods and the webhook's Events with the user's own
credentials (``reader``), tells the story with the webhook's own parts and admits nothing
(``story``: the plan rebuilt from the stored object and its applied record, told by
``explain``; the attempts counted as the Job controller counts them; the next attempt as
the pod kind's planner gives it; the rule that decided a finished workload) and prints it
(``render``: text, or JSON with stable keys).

Exit codes: 0 the story was told; 1 told, but a part could not be read (pods, Events,
child Jobs: each named); 2 nothing could be told (no cluster, the workload not found or
forbidden, a bad reference).
"""

from __future__ import annotations

from typing import Any

from webhook.cluster.limits import LimitLookup
from webhook.cluster.nodes import NodeAnswer
from webhook.cluster.version import ServerVersion
from webhook.kube.limitrange import memory_limits
from webhook.kube.scheduling import Placement, fits, node_of
from webhook.kube.versions import KubeVersion
from webhook.policy.config import Config
from webhook.status.explained import Readmit
from webhook.status.reader import Reader, StatusError, Unreadable, connect, parse_ref, read_tree
from webhook.status.recorded import Documents, RecordedReader
from webhook.status.recorded import read as read_recorded
from webhook.status.render import render_text, to_json
from webhook.status.story import Lookups, Story, tell

EXIT_OK, EXIT_PARTIAL, EXIT_UNREADABLE = 0, 1, 2

__all__ = [
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_UNREADABLE",
    "LiveLookups",
    "StatusError",
    "Story",
    "render_text",
    "status",
    "to_json",
]


class LiveLookups(Lookups):
    """The namespace's LimitRanges and the Nodes, read with the user's credentials when
    the next attempt's planner asks (a user who may not list Nodes gets what the
    webhook does when it cannot: failed nodes avoided by preference only)."""

    def __init__(self, reader: Reader | RecordedReader):
        super().__init__()
        self.reader = reader
        self.core_api = reader.core
        self._limits: dict[str, LimitLookup] = {}
        self._nodes: list[Any] | None = None
        self._nodes_error = ""

    def limit_ranges(self, namespace: str) -> LimitLookup:
        if namespace not in self._limits:
            try:
                found = self.reader.limit_ranges(namespace)
                self._limits[namespace] = LimitLookup(True, memory_limits(found))
            except Unreadable as err:
                self._limits[namespace] = LimitLookup(False, reason=f"{err}")
                self.notes.append(
                    f"{err}: the next attempt is shown without the memory raise the webhook "
                    "(which reads them) may give it"
                )
        return self._limits[namespace]

    def placement(self, question: Placement) -> NodeAnswer:
        if self._nodes is None and not self._nodes_error:
            try:
                self._nodes = [n for n in map(node_of, self.reader.nodes()) if n is not None]
            except Unreadable as err:
                self._nodes_error = f"Nodes unreadable with your credentials: {err.detail}"
                self.notes.append(
                    f"{err}: failed nodes are shown avoided by preference; the webhook, which "
                    "reads Nodes, requires it while another node fits the pod"
                )
        if self._nodes is None:
            return NodeAnswer(False, reason=self._nodes_error)
        return NodeAnswer(True, any(fits(node, question) for node in self._nodes))


def cluster_version(connection: Any) -> KubeVersion | None:
    """The cluster's version, as the webhook reads it (``/version``, readable by everyone:
    ``system:public-info-viewer``); ``None`` when it does not answer."""
    version = ServerVersion(connection.api)
    version.poll()
    return version.kubernetes_version()


def status(
    reference: str,
    namespace: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    config: Config | None = None,
    recorded: str | None = None,
    documents: Documents | None = None,
    readmit: Readmit | None = None,
) -> tuple[Story, int]:
    """Read and tell; ``StatusError`` when nothing can be told. With ``recorded`` (a file
    ``kubectl get -o yaml`` wrote), the objects are read from it by ``documents`` instead
    of from a cluster. ``readmit`` tells the plan of a workload whose record keeps no
    rules' origins (``explained_of``); the layer above gives both, status admits nothing."""
    ref = parse_ref(reference)
    if recorded is not None:
        if documents is None:
            raise StatusError(f"no reader of recorded objects given for {recorded}")
        reader: Any = RecordedReader(read_recorded(recorded, documents), recorded)
        where = namespace or reader.namespace_of(ref.kind, ref.name) or "default"
        tree = read_tree(reader, ref, where)
        return _told(tell(tree, config, LiveLookups(reader), readmit=readmit))
    connection = connect(kubeconfig, context, namespace)
    reader = Reader(connection.api)
    tree = read_tree(reader, ref, connection.namespace)
    version = cluster_version(connection)
    lookups = LiveLookups(reader)
    return _told(tell(tree, config, lookups, kubernetes_version=version, readmit=readmit))


def _told(story: Story) -> tuple[Story, int]:
    return story, EXIT_PARTIAL if story.unread else EXIT_OK
