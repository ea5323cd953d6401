"""Reading a workload, its Jobs, their pods and our Events with the user's own credentials.

``retry-webhook status`` runs where the user runs ``kubectl``: it connects as kubectl does
(``--kubeconfig``, else ``$KUBECONFIG`` or ``~/.kube/config``, else the pod's
ServiceAccount) and asks the API server only what a user who may ``get`` the workload and
``list`` its pods and Events may ask. Every request is bounded; an error on the workload
itself is a ``StatusError`` (nothing can be shown), an error on a part (pods, Events,
child Jobs) is kept in ``Tree.unread`` and the rest is shown.

Requests, by kind (what each controller makes and how its objects are found: each kind's
story facts, ``kinds/<kind>/story.py``, say how):

- Job (batch/v1): GET the Job; list its pods by ``batch.kubernetes.io/controller-uid``
  (the API server puts that label on the template, ``generateSelector`` in
  pkg/registry/batch/job/strategy.go). A Job a CronJob made, without an audit record of
  its own: GET the CronJob too (its Jobs get only the jobTemplate's metadata,
  ``getJobFromTemplate2`` in pkg/controller/cronjob/utils.go; the record is the CronJob's).
- CronJob (batch/v1): GET it; list the namespace's Jobs and keep those it controls
  (ownerReference: the CronJob controller sets no label of its own); the latest few.
- JobSet (jobset.x-k8s.io/v1alpha2): GET it; list its Jobs by
  ``jobset.sigs.k8s.io/jobset-name`` (``labelAndAnnotateObject`` in jobset
  pkg/controllers/jobset_controller.go), then their pods.
- TrainJob (trainer.kubeflow.org/v1alpha1): GET it, then its JobSet (same name, controlled
  by the TrainJob), as above.
- RayJob (ray.io/v1): GET it, then the submitter Job KubeRay makes for it (same name,
  controlled by the RayJob: ``createNewK8sJob`` in ray-operator/controllers/ray/
  rayjob_controller.go), then its pods.
- Events (events.k8s.io/v1): list those regarding the workload and each of its Jobs by
  the field selectors ``regarding.kind`` and ``regarding.name`` (served for
  events.k8s.io/v1 by conversion to ``involvedObject.*``: ``ToSelectableFields`` in
  pkg/registry/core/event/strategy.go); only ours are kept
  (``reportingController == retry-policy.dev/webhook``, checked here: older API servers
  cannot select on it), and only those about these very objects (their UIDs).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster.events import REPORTING_CONTROLLER
from webhook.kinds import registry
from webhook.kinds.base import KindSpec
from webhook.kinds.story import Controlled, Labelled, Made, OwnJob, StoryFacts
from webhook.kube import apiclient
from webhook.kube.objects import controller_of, mapping
from webhook.kube.wellknown import JOB_UID_LABEL
from webhook.plan.audit import AUDIT

#: Seconds for one request (connect, read).
TIMEOUT = (5, 20)
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


#: A workload kind ``status`` reads: where it is served, the names users type, and what
#: its story is told with (``KindSpec.story``).
Kind = KindSpec
#: The kinds ``status`` tells: the registry's that name their story facts.
KINDS = tuple(spec for spec in registry.KINDS if spec.story is not None)
_BY_NAME = {name: kind for kind in KINDS for name in kind.names}
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def facts_of(kind: Kind) -> StoryFacts:
    """What ``kind``'s story is told with (one of ``KINDS``)."""
    if kind.story is None:
        raise StatusError(f"status does not tell a {kind.kind}")
    return kind.story.load()


class StatusError(Exception):
    """Nothing can be shown: the reference, the connection or the workload itself."""


@dataclass(frozen=True)
class Ref:
    kind: Kind
    name: str


def parse_ref(text: str) -> Ref:
    """``job/NAME`` (also ``jobs/``, ``job.batch/``, and the other kinds' names, as
    ``kubectl get`` takes them)."""
    kind_name, slash, name = text.partition("/")
    kind = _BY_NAME.get(kind_name.lower())
    if not slash or kind is None or not name:
        accepted = ", ".join(f"{k.names[0]}/NAME" for k in KINDS)
        raise StatusError(f"{text!r} is not a workload reference; accepted: {accepted}")
    if not _NAME.fullmatch(name):
        raise StatusError(f"{name!r} is not a valid object name")
    return Ref(kind, name)


@dataclass
class Connection:
    api: Any  # kubernetes.client.ApiClient
    namespace: str
    server: str


def connect(
    kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None
) -> Connection:
    """The user's API connection and namespace: ``namespace``, else the kubeconfig
    context's, else the pod's (in a cluster), else ``default`` (as kubectl)."""
    apiclient.quiet()
    from kubernetes import client, config

    configuration = client.Configuration()
    paths = apiclient.kubeconfig_paths(kubeconfig)
    has_file = bool(kubeconfig or os.environ.get("KUBECONFIG")) or os.path.exists(paths[0])
    hint = "set KUBECONFIG or --kubeconfig (as for kubectl)"
    found_namespace = None
    try:
        if has_file:
            config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
            found_namespace = _context_namespace(kubeconfig, context)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
            found_namespace = _file_text(SERVICE_ACCOUNT_NAMESPACE)
        else:
            raise StatusError(
                f"no Kubernetes API: no kubeconfig ({paths[0]} does not exist) and not "
                f"running in a pod; {hint}"
            )
    except (config.ConfigException, OSError, TypeError, ValueError) as err:
        where = apiclient.kubeconfig_problem(kubeconfig, err) if has_file else str(err)
        raise StatusError(f"no Kubernetes API: {where}; {hint}") from None
    return Connection(
        client.ApiClient(configuration),
        namespace or found_namespace or "default",
        str(configuration.host),
    )


def _context_namespace(kubeconfig: str | None, context: str | None) -> str | None:
    from kubernetes import config

    contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
    value = mapping(mapping(chosen).get("context")).get("namespace")
    return value if isinstance(value, str) and value else None


def _file_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


class Unreadable(Exception):
    """One request the API answered with an error (or did not answer)."""

    def __init__(self, what: str, status: int | None, detail: str):
        self.what = what
        self.status = status
        self.detail = detail
        super().__init__(f"{what}: {detail}")


def _call(what: str, request: Callable[[], Any]) -> Any:
    """The JSON of one request, or ``Unreadable`` saying what failed, in words."""
    try:
        resp = request()
        return json.loads(resp.data)
    except Exception as err:
        status, detail = apiclient.describe(err)
        raise Unreadable(what, status, detail) from None


class Reader:
    """The requests ``status`` makes, each bounded (``TIMEOUT``)."""

    def __init__(self, api: Any):
        from kubernetes import client

        self.batch = client.BatchV1Api(api)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.events = client.EventsV1Api(api)

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        what = f"{kind.kind} {namespace}/{name}"
        opts = {"_preload_content": False, "_request_timeout": TIMEOUT}
        # (the custom objects API GETs any kind by group, version and plural: a Job's
        # path is the one the batch API's read_namespaced_job GETs)
        return _call(
            what,
            lambda: self.custom.get_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, name, **opts
            ),
        )

    def jobs(self, namespace: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        what = f"Jobs in namespace {namespace}"
        return self._list(
            what,
            lambda **page: self.batch.list_namespaced_job(
                namespace, label_selector=label_selector, **page
            ),
        )

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self._list(
            f"pods in namespace {namespace}",
            lambda **page: self.core.list_namespaced_pod(
                namespace, label_selector=label_selector, **page
            ),
        )

    def events_regarding(self, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
        selector = f"regarding.kind={kind},regarding.name={name}"
        return self._list(
            f"Events in namespace {namespace}",
            lambda **page: self.events.list_namespaced_event(
                namespace, field_selector=selector, **page
            ),
        )

    def limit_ranges(self, namespace: str) -> list[dict[str, Any]]:
        return self._list(
            f"LimitRanges in namespace {namespace}",
            lambda **page: self.core.list_namespaced_limit_range(namespace, **page),
        )

    def nodes(self) -> list[dict[str, Any]]:
        return self._list("Nodes", lambda **page: self.core.list_node(**page))

    def _list(self, what: str, request: Callable[..., Any]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token = None
        while True:
            page = _call(what, functools.partial(request, **_page(token)))
            items.extend(i for i in page.get("items") or () if isinstance(i, dict))
            token = mapping(page.get("metadata")).get("continue")
            if not token:
                return items


def _page(token: str | None) -> dict[str, Any]:
    return {
        "limit": 500,
        "_continue": token,
        "_preload_content": False,
        "_request_timeout": TIMEOUT,
    }


@dataclass
class Tree:
    """What was read: the workload, the Jobs its story is told by (the Job itself; a
    CronJob's latest; a JobSet's current ones), their pods, our Events; and what could
    not be read (said, and the story shown without it)."""

    kind: Kind
    workload: dict[str, Any]
    #: What its controller made for it, told in its place (``kinds.story.Made``: a
    #: TrainJob's JobSet), and its kind; ``None``: nothing (yet), or its Jobs are its own.
    made: dict[str, Any] | None = None
    made_kind: Kind | None = None
    #: A Job's owner that holds its audit record (``StoryFacts.audits_its_jobs``: a
    #: CronJob's), read when the Job has no record of its own.
    auditor: dict[str, Any] | None = None
    jobs: list[dict[str, Any]] = field(default_factory=list)
    #: Jobs older than the latest shown (``kinds.story.Controlled``), by name (newest first).
    older_jobs: list[str] = field(default_factory=list)
    #: Job UID -> its pods.
    pods: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)


def read_tree(reader: Reader, ref: Ref, namespace: str) -> Tree:
    """Read everything the story needs; ``StatusError`` when the workload itself cannot
    be read."""
    try:
        workload = reader.get(ref.kind, namespace, ref.name)
    except Unreadable as err:
        raise StatusError(_workload_error(err, ref, namespace)) from None
    tree = Tree(ref.kind, workload)
    _find_jobs(reader, tree, namespace, ref.kind, workload)
    for job in tree.jobs:
        job_uid = mapping(job.get("metadata")).get("uid")
        if not isinstance(job_uid, str) or not job_uid:
            continue
        try:
            tree.pods[job_uid] = reader.pods(namespace, f"{JOB_UID_LABEL}={job_uid}")
        except Unreadable as err:
            tree.unread.append(str(err))
    tree.events = _our_events(reader, tree, namespace)
    return tree


def _find_jobs(reader: Reader, tree: Tree, namespace: str, kind: Kind, obj: dict[str, Any]) -> None:
    """The Jobs of ``obj``, found as its kind's story facts say (``kinds.story.Children``)."""
    meta = mapping(obj.get("metadata"))
    uid = meta.get("uid")
    children = facts_of(kind).children
    if isinstance(children, OwnJob):
        tree.jobs = [obj]
        tree.auditor = _auditor(reader, namespace, obj)
    elif isinstance(children, Controlled):
        _controlled_jobs(reader, tree, namespace, uid, children.latest)
    elif isinstance(children, Labelled):
        _labelled_jobs(reader, tree, namespace, obj, children)
    elif isinstance(children, Made):
        made_kind = registry.spec_for(children.group, children.version, children.kind)
        if made_kind is None or made_kind.story is None:
            return
        made = _named_child(reader, tree, made_kind, namespace, str(meta.get("name")), uid)
        if made is None:
            return
        if isinstance(facts_of(made_kind).children, OwnJob):
            tree.jobs = [made]
            return
        tree.made, tree.made_kind = made, made_kind
        _find_jobs(reader, tree, namespace, made_kind, made)


def _named_child(
    reader: Reader, tree: Tree, kind: Kind, namespace: str, name: str, uid: Any
) -> dict[str, Any] | None:
    """The object of ``kind`` named as the workload and controlled by it (a TrainJob's
    JobSet, a RayJob's submitter Job); ``None``: none (yet), or unreadable (said)."""
    try:
        child = reader.get(kind, namespace, name)
    except Unreadable as err:
        if err.status != 404:
            tree.unread.append(str(err))
        return None
    return child if _owned_by(child, uid) else None


def _auditor(reader: Reader, namespace: str, job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The owner that made ``job`` and holds its audit record, when the Job has none of
    its own (``StoryFacts.audits_its_jobs``: a CronJob's Jobs get only the jobTemplate's
    metadata). Read only then: one GET, and none for a Job made by hand; unreadable, it
    is left out unsaid (the rest of the story needs no owner)."""
    meta = mapping(job.get("metadata"))
    if AUDIT in mapping(meta.get("annotations")):
        return None
    owner = controller_of(meta)
    kind = registry.kind_of(owner) if owner is not None else None
    if owner is None or kind is None or kind.story is None:
        return None
    if not facts_of(kind).audits_its_jobs:
        return None
    name = owner.get("name")
    if not isinstance(name, str) or not name:
        return None
    try:
        found = reader.get(kind, namespace, name)
    except Unreadable:
        return None  # the audit is extra: a user who may not get the owner sees the rest
    return found if mapping(found.get("metadata")).get("uid") == owner.get("uid") else None


def _workload_error(err: Unreadable, ref: Ref, namespace: str) -> str:
    what = f"{ref.kind.kind} {namespace}/{ref.name}"
    if err.status == 404:
        served = "" if facts_of(ref.kind).built_in else f" (or {ref.kind.plural} "
        served += f"of {ref.kind.api_version} are not served here)" if served else ""
        return f"{what} not found{served}; check the name and the namespace (-n)"
    if err.status == 403:
        return (
            f"{what}: the API server refused (HTTP 403): your credentials may not get "
            f"{ref.kind.plural} in namespace {namespace}"
        )
    return f"{what} could not be read: {err.detail}"


def _owned_by(obj: Mapping[str, Any], uid: Any) -> bool:
    owner = controller_of(obj.get("metadata"))
    return owner is not None and isinstance(uid, str) and owner.get("uid") == uid


def _created(obj: Mapping[str, Any]) -> str:
    return str(mapping(obj.get("metadata")).get("creationTimestamp") or "")


def _controlled_jobs(reader: Reader, tree: Tree, namespace: str, uid: Any, latest: int) -> None:
    try:
        jobs = [j for j in reader.jobs(namespace) if _owned_by(j, uid)]
    except Unreadable as err:
        tree.unread.append(str(err))
        return
    jobs.sort(key=lambda j: (_created(j), str(mapping(j.get("metadata")).get("name"))))
    jobs.reverse()
    tree.jobs = jobs[:latest]
    tree.older_jobs = [str(mapping(j.get("metadata")).get("name")) for j in jobs[latest:]]


def _labelled_jobs(
    reader: Reader, tree: Tree, namespace: str, obj: Mapping[str, Any], labels: Labelled
) -> None:
    meta = mapping(obj.get("metadata"))
    try:
        jobs = reader.jobs(namespace, f"{labels.name_label}={meta.get('name')}")
    except Unreadable as err:
        tree.unread.append(str(err))
        return
    uid = meta.get("uid")
    tree.jobs = sorted(
        (
            j
            for j in jobs
            if _owned_by(j, uid)
            or mapping(mapping(j.get("metadata")).get("labels")).get(labels.uid_label) == uid
        ),
        key=lambda j: str(mapping(j.get("metadata")).get("name")),
    )


def _our_events(reader: Reader, tree: Tree, namespace: str) -> list[dict[str, Any]]:
    subjects = [(tree.kind.kind, tree.workload)]
    if tree.made is not None and tree.made_kind is not None:
        subjects.append((tree.made_kind.kind, tree.made))
    subjects += [("Job", j) for j in tree.jobs if j is not tree.workload]
    found: dict[str, dict[str, Any]] = {}
    for kind, obj in subjects:
        meta = mapping(obj.get("metadata"))
        try:
            events = reader.events_regarding(namespace, kind, str(meta.get("name")))
        except Unreadable as err:
            tree.unread.append(str(err))
            return list(found.values())
        for event in events:
            regarding = mapping(event.get("regarding"))
            if event.get("reportingController") != REPORTING_CONTROLLER:
                continue
            if regarding.get("uid") and regarding.get("uid") != meta.get("uid"):
                continue  # about an earlier object of the same name
            found[str(mapping(event.get("metadata")).get("uid") or id(event))] = event
    return list(found.values())
