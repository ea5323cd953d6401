"""What the policy reads of a Job or a Pod: the view its mutator runs on, and the memo's key.

Most of an admitted object is never read by the policy: names and uids, labels, images,
commands and arguments, resources, volumes, env var *values*, the managedFields of
controllers, most of a ``kubectl apply`` record. Two Jobs a pipeline submits from one
template differ only there, and so do two Jobs a person applies from one manifest with a
new name. The view keeps what the Job and Pod mutators read, and drops the rest:

- metadata: the namespace, our annotations (``retry-policy.dev/...``; a pod also keeps
  the JobSet restart-attempt and index failure-count it takes attempts from, and a pod
  that learns from earlier attempts its completion index and JobSet labels, the set's UID
  among them, and one that may be held back JobSet's exclusive placement annotations), a
  Job's Kueue queue and MultiKueue origin labels and our own labels, the
  controller of each owner reference (a pod keeps its owners whole unless its attempt is
  annotated and it does not learn from earlier attempts: they name the Job whose
  failures it looks up), and the *records of intent*
  reduced to what ``webhook.kube.intent`` is asked of a Job: which of the spec fields in
  ``kinds.jobspec.INTENT_FIELDS`` the last-applied record and the server-side-apply
  entries name;
- the spec (a Job's whole, but its pod template), and of a pod template or a pod spec:
  restartPolicy, nodeSelector, affinity, nodeName, the memory of pod-level resources, the
  tolerations of a pod kept off failed nodes, and each container's name, restartPolicy,
  env var names and memory request and limit.

The mutator runs on the view, not on the object, and the patch is the diff between the
view and the mutated view. That is a patch for the object too: the view keeps every
list's length and every mapping the mutators write into, so paths mean the same in
both, and a mutator never writes where the view dropped something. Because the answer
is computed from the view alone, it is the same for every object with the same view by
construction, which is what lets the memo (``webhook.admission.memo``) key on the view and answer
a Job it has never seen.

The contract is that a mutator reads nothing the view drops. It is checked, not assumed:
with ``RPW_CHECK_VIEWS=1`` (every test run sets it) the engine also runs the mutator on
the whole object and fails the request when the two answers differ in anything (patch,
warnings, denial), and property tests do the same for generated objects and for objects
changed outside the view. Objects of a shape the view does not expect (a spec that is not
a mapping) get no view: the mutator then runs on the whole object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from webhook.cluster import history
from webhook.kinds.jobspec import INTENT_FIELDS
from webhook.kube.wellknown import (
    COMPLETION_INDEX,
    EXCLUSIVE_TOPOLOGY,
    INDEX_FAILURE_COUNT,
    JOBSET_JOB_INDEX,
    JOBSET_NAME,
    JOBSET_UID,
    LAST_APPLIED,
    MULTIKUEUE_ORIGIN,
    NODE_SELECTOR_STRATEGY,
    QUEUE_LABEL,
    REPLICATED_JOB,
    RESTART_ATTEMPT,
)
from webhook.policy.config import Config
from webhook.policy.model import PREFIX

#: A pod annotated with its attempt looks nothing up (``kinds.pod.mutate.attempt_of``).
ATTEMPT = PREFIX + "attempt"
#: The keys that make a pod learn from earlier attempts (``history.wants_history``);
#: containers' memory is read only for the first (``webhook.plan.failureaware``).
OOM_FACTOR, AVOID_NODES = history.WANTS_HISTORY
#: The keys that make a pod read its attempt and the previous failure
#: (``webhook.plan.delays``): as one that learns from earlier attempts, and with
#: ``retry-delay`` its scheduling gates and labels, which the gate is written into.
ATTEMPT_ENV, RETRY_DELAY = PREFIX + "attempt-env", PREFIX + "retry-delay"

#: Of a pod spec or pod template spec, what a mutator reads: the placement fields, the
#: restart policy a podFailurePolicy needs, whether pods find each other by name (the
#: peers warning: ``kinds.workload.run_together``), and the containers (``_container``).
POD_SPEC_READ = (
    "restartPolicy",
    "nodeSelector",
    "affinity",
    "nodeName",
    "activeDeadlineSeconds",
    "subdomain",
)
CONTAINER_GROUPS = ("initContainers", "containers")
#: (The same, as sets: ``_pod_spec`` asks every key of a pod spec whether it is one.)
_POD_SPEC_READ, _CONTAINER_GROUPS = frozenset(POD_SPEC_READ), frozenset(CONTAINER_GROUPS)
#: Of a container, what a mutator reads besides its env vars' names and its memory.
CONTAINER_READ = ("name", "restartPolicy", "restartPolicyRules")
#: The key that makes a mutator write containers' restart fields (``plan.inplace``).
IN_PLACE = PREFIX + "in-place-exit-codes"
#: Of a pod's annotations and labels besides ours, those it takes its attempt from; one
#: that learns from earlier attempts (``webhook.cluster.history``) also reads where it belongs:
#: its completion index and, in a JobSet, its replicated Job and job index.
POD_ANNOTATIONS = (RESTART_ATTEMPT, INDEX_FAILURE_COUNT)
POD_HISTORY_ANNOTATIONS = (*POD_ANNOTATIONS, COMPLETION_INDEX)
#: A pod that may be held back also reads whether it follows a leader
#: (``webhook.kube.jobsetplacement``).
POD_GATED_ANNOTATIONS = (JOBSET_NAME, EXCLUSIVE_TOPOLOGY, NODE_SELECTOR_STRATEGY)
POD_LABELS = (RESTART_ATTEMPT,)
#: Of a Job's labels, the one that queues it in Kueue (``plan.queued``) and the one that
#: makes it a MultiKueue worker's copy (``kinds.audit``); ours (``retry-policy.dev/managed``)
#: are kept too, and the labels mapping with them, which the label is written into.
JOB_LABELS = (QUEUE_LABEL, MULTIKUEUE_ORIGIN)
POD_HISTORY_LABELS = (
    *POD_LABELS,
    REPLICATED_JOB,
    JOBSET_JOB_INDEX,
    JOBSET_UID,
)
#: Of an owner reference: what tells the controller and its kind.
OWNER_READ = ("apiVersion", "kind", "controller")
#: The fields a Job's records of intent are asked about, as a last-applied record and
#: as server-side-apply fields name them.
_QUOTED = tuple(  # '"backoffLimit' also finds '"backoffLimitPerIndex"': one search less
    f'"{name}'
    for name in INTENT_FIELDS
    if not any(name.startswith(m) for m in INTENT_FIELDS if m != name)
)
_APPLY_KEYS = tuple(f"f:{name}" for name in INTENT_FIELDS)


def job_view(job: Mapping[str, Any], config: Config | None = None) -> dict[str, Any] | None:
    """The containers' memory is kept when the Job asks for ``oom-memory-factor`` or an
    admin default of ``config`` may (its check reads it); otherwise not, so Jobs of one
    template that differ in memory share a view."""
    metadata = job.get("metadata")
    spec = job.get("spec")
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        return None
    memory = _asks(metadata, OOM_FACTOR) or (
        config is not None and config.has_default("oom-memory-factor")
    )
    restarts = _asks(metadata, IN_PLACE) or (
        config is not None and config.has_default("in-place-exit-codes")
    )
    return _top(
        job,
        _metadata(metadata, (), reduce_owners=True, labels=JOB_LABELS, intent=True, ours=True),
        {
            k: _template(v, memory, restarts) if k == "template" and isinstance(v, dict) else v
            for k, v in spec.items()
        },
    )


def pod_view(pod: Mapping[str, Any], config: Config | None = None) -> dict[str, Any] | None:
    metadata = pod.get("metadata")
    spec = pod.get("spec")
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        return None
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict):
        annotations = {}
    learns = any(k in annotations for k in (OOM_FACTOR, AVOID_NODES, ATTEMPT_ENV, RETRY_DELAY))
    gated = RETRY_DELAY in annotations
    also = POD_HISTORY_ANNOTATIONS if learns else POD_ANNOTATIONS
    meta = _metadata(
        metadata,
        (*also, *POD_GATED_ANNOTATIONS) if gated else also,
        reduce_owners=ATTEMPT in annotations and not learns,
        labels=POD_HISTORY_LABELS if learns else POD_LABELS,
        keep_labels=gated,
    )
    spec_view = _pod_spec(
        spec,
        OOM_FACTOR in annotations,
        IN_PLACE in annotations,
        AVOID_NODES in annotations,
        gates=gated,
    )
    return _top(pod, meta, spec_view)


def _asks(metadata: Mapping[str, Any], key: str) -> bool:
    annotations = metadata.get("annotations")
    return isinstance(annotations, dict) and key in annotations


# Every part keeps the order of the object's keys: the patch lists its operations in
# that order, and the view's patch must be the object's, operation for operation.


def _top(obj: Mapping[str, Any], metadata: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The object with its metadata's and spec's views, without status (never read)."""
    view: dict[str, Any] = {}
    for key, value in obj.items():
        if key == "metadata":
            view[key] = metadata
        elif key == "spec":
            view[key] = spec
        elif key != "status":
            view[key] = value
    return view


def _metadata(
    metadata: Mapping[str, Any],
    also_annotations: tuple[str, ...],
    reduce_owners: bool,
    labels: tuple[str, ...] = (),
    intent: bool = False,
    keep_labels: bool = False,
    ours: bool = False,
) -> dict[str, Any]:
    """``keep_labels``: the labels mapping stays, reduced to ``labels``, even when none of
    them is there (a mutator writes into it). ``ours``: a pod template's, whose
    ``retry-policy.dev/`` labels the Job mutator writes (``plan.causes``): they, and
    the labels mapping itself, are kept."""
    meta: dict[str, Any] = {}
    for key, value in metadata.items():
        if key == "namespace":
            meta[key] = value
        elif key == "annotations":
            meta[key] = _annotations(value, also_annotations, intent)
        elif key == "ownerReferences":
            meta[key] = _owners(value) if reduce_owners else value
        elif key == "labels":
            if not isinstance(value, dict):
                meta[key] = value
            elif ours:
                meta[key] = {
                    k: v
                    for k, v in value.items()
                    if k in labels or (isinstance(k, str) and k.startswith(PREFIX))
                }
            elif keep_labels or (labels and not set(labels).isdisjoint(value)):
                meta[key] = {k: v for k, v in value.items() if k in labels}
        elif key == "managedFields" and intent:
            applied = _applied_fields(value)
            if applied not in ([], None):  # none (or null) says what [] says: unknown
                meta[key] = applied
    return meta


def _annotations(annotations: Any, also: tuple[str, ...], intent: bool) -> Any:
    if not isinstance(annotations, dict):
        return annotations
    kept: dict[str, Any] = {}
    for key, value in annotations.items():
        if (isinstance(key, str) and key.startswith(PREFIX)) or key in also:
            kept[key] = value
        elif key == LAST_APPLIED and intent:
            kept[key] = _spec_record(value)
    return kept


def _owners(owners: Any) -> Any:
    if not isinstance(owners, list):
        return owners
    return [
        {k: v for k, v in ref.items() if k in OWNER_READ} if isinstance(ref, dict) else ref
        for ref in owners
    ]


def _template(template: Mapping[str, Any], memory: bool, restarts: bool) -> dict[str, Any]:
    view: dict[str, Any] = {}
    for key, value in template.items():
        if key == "metadata":
            view[key] = _metadata(value, (), True, ours=True) if isinstance(value, dict) else value
        elif key == "spec":
            view[key] = _pod_spec(value, memory, restarts) if isinstance(value, dict) else value
    return view


def _pod_spec(
    spec: Mapping[str, Any],
    memory: bool,
    restarts: bool = False,
    placement: bool = False,
    gates: bool = False,
) -> dict[str, Any]:
    """``placement``: a pod kept off failed nodes, whose tolerations tell which nodes
    remain for it (``webhook.kube.scheduling``); ``gates``: a pod that may be held back,
    whose scheduling gates are read and written (``webhook.kube.gates``)."""
    view: dict[str, Any] = {}
    for key, value in spec.items():
        if (
            key in _POD_SPEC_READ
            or (placement and key == "tolerations")
            or (gates and key == "schedulingGates")
        ):
            view[key] = value
        elif key in _CONTAINER_GROUPS:
            view[key] = (
                [_container(c, memory, restarts) for c in value]
                if isinstance(value, list)
                else value
            )
        elif key == "resources" and memory:  # pod-level: memory raises leave such pods be
            view[key] = _memory(value)
    return view


def _container(container: Any, memory: bool, restarts: bool = False) -> Any:
    """A container's name, its restartPolicy (an init container with ``Always`` is a
    native sidecar, whose exit codes the policy leaves out) and restart rules, its env
    vars' names (their values are never read) and, when ``memory``, its memory request
    and limit."""
    if not isinstance(container, dict):
        return container
    if memory or restarts:
        # More than env may be written (memory, restart fields): in the container's order
        # of keys, which the patch lists them in.
        view: dict[str, Any] = {}
        for key, value in container.items():
            if key in CONTAINER_READ:
                view[key] = value
            elif key == "env":
                view[key] = _env_names(value)
            elif key == "resources" and memory:
                view[key] = _memory(value)
        return view
    # (Only env may be written: the order of these keys cannot change the patch's.)
    view = {k: container[k] for k in CONTAINER_READ if k in container}
    env = container.get("env", _ABSENT)
    if env is not _ABSENT:
        view["env"] = _env_names(env)
    return view


_ABSENT = object()


def _env_names(env: Any) -> Any:
    if not isinstance(env, list):
        return env
    try:  # every var a mapping with a name (any other JSON value fails the lookup)
        return [{"name": e["name"]} for e in env]
    except (TypeError, KeyError):
        return [{"name": e["name"]} if isinstance(e, dict) and "name" in e else e for e in env]


def _memory(resources: Any) -> Any:
    """Of a container's resources, the memory of its requests and limits (each mapping
    kept, even without memory: a mutator writes into it)."""
    if not isinstance(resources, dict):
        return resources
    view: dict[str, Any] = {}
    for kind, values in resources.items():
        if kind in ("requests", "limits"):
            if isinstance(values, dict):
                view[kind] = {"memory": values["memory"]} if "memory" in values else {}
            else:
                view[kind] = values
    return view


def _spec_record(raw: Any) -> Any:
    """A last-applied record reduced to which of ``INTENT_FIELDS`` it writes under spec.
    A record that never names them (as ``webhook.kube.intent`` tells, without parsing it: the
    usual case) writes none; one that is not a JSON object is kept as it is (intent then
    reads managedFields)."""
    if not isinstance(raw, str):
        return raw
    if raw.startswith("{") and "\\" not in raw and not any(map(raw.__contains__, _QUOTED)):
        return "{}"
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    if not isinstance(record, dict):
        return raw
    spec = record.get("spec")
    if not isinstance(spec, dict):
        return "{}"
    return orjson.dumps({"spec": {k: None for k in INTENT_FIELDS if k in spec}}).decode()


def _applied_fields(managed: Any) -> Any:
    """Server-side-apply entries (``operation: Apply``; intent reads no others), each
    reduced as ``_spec_record`` reduces a last-applied record."""
    if not isinstance(managed, list):
        return managed
    kept = []
    for entry in managed:
        if not isinstance(entry, dict) or entry.get("operation") != "Apply":
            continue
        fields = entry.get("fieldsV1")
        spec = fields.get("f:spec") if isinstance(fields, dict) else None
        if isinstance(spec, dict):
            fields = {"f:spec": {k: None for k in _APPLY_KEYS if k in spec}}
        elif isinstance(fields, dict) and fields:
            fields = {"f:spec": spec} if "f:spec" in fields else {"": None}
        kept.append({"operation": "Apply", "fieldsV1": fields})
    return kept
