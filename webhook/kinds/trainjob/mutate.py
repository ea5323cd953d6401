"""trainer.kubeflow.org/v1alpha1 TrainJob (Kubeflow Trainer v2): the policy goes to the
JobSet the trainer controller makes from the TrainJob's runtime.

A TrainJob names a (Cluster)TrainingRuntime; the trainer builds a JobSet from the runtime's
``spec.template`` and server-side applies it (field manager ``trainer``). So:

- **Carrying the annotations.** Trainer v2.2 gives the JobSet the annotations of the
  runtime's template and of the TrainJob's ``spec.runtimePatches[].trainingRuntimeSpec.
  template.metadata``, in that order (``newRuntimeInfo`` in pkg/runtime/core/
  trainingruntime.go); not the TrainJob's own metadata (v2.0 and v2.1 had
  ``spec.annotations`` for this; v2.2 replaced it with runtimePatches). The webhook adds
  one runtime patch, keyed by its manager ``retry-policy.dev/webhook``, carrying the
  TrainJob's ``retry-policy.dev/`` annotations; the JobSet mutator applies the policy at
  the JobSet's admission (child Job rules, ``maxRestarts``, placement).
- **Admin defaults.** A JobSet with a controller owner gets no defaults at its own
  admission (``default_layers``): the TrainJob's admission resolves them, and they travel
  in the same patch as ``retry-policy.dev/defaults`` (``carried_layers``), so the JobSet is
  judged with the defaults the TrainJob was admitted with, and a default still counts as
  one (skipped with a warning, never denied, when it cannot apply).
- **Validation on apply.** With the runtime known (``kinds.trainjob.runtimes``: a watch-backed
  cache in the server, the same input for the CLI), the JobSet is built as the trainer
  builds it (``jobset_for``: node counts, and ``resourcesPerNode`` as the cluster's Trainer
  release gives it, both releases' ways when that is not known) and the JobSet mutator
  runs on it: what it would deny at the JobSet's admission (seen only as an Event on the
  TrainJob, and retried by the trainer forever) is denied on the TrainJob's ``kubectl
  apply``, naming the runtime's own fields, and what it would change is said as warnings
  (a TrainJob's initializer Jobs keep their own retries: ``jobset.initializers``). Without
  the runtime, the annotations' grammar and what no JobSet can honour are checked, and the
  JobSet's own admission checks the rest.
- **Updates.** Trainer accepts a change of ``runtimePatches`` only while the TrainJob is
  suspended (``checkRuntimePatchesImmutability``), and a ``kubectl apply`` of a manifest
  with runtime patches of its own replaces the whole list (a JSON merge patch): ``restore``
  puts the webhook's entry back exactly as it was.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.cluster import runtimes as rt
from webhook.kinds import audit
from webhook.kinds import inplace as in_place_rules
from webhook.kinds.jobset.mutate import (
    JobSetMutator,
    Owner,
    check_unsupported,
    initializers,
)
from webhook.kinds.jobset.rules import in_place_bound
from webhook.kinds.ruleplan import FREE_UNBOUNDED, PEERS_UNBOUNDED, UNBOUNDED, unbounded_note
from webhook.kinds.workload import WorkloadMutator, get_path, note_peers, pod_count
from webhook.kube.objects import items, mapping
from webhook.kube.wellknown import ANCESTOR_LABEL, JOBSET_API_VERSION, TRAINER_GROUP
from webhook.plan import causes, failureaware, inplace, queued
from webhook.plan.audit import AUDITED, AuditRecord
from webhook.plan.outcome import Change, Context, Outcome
from webhook.plan.policies import asks_for_policy
from webhook.policy.model import (
    APPLIED,
    CARRIED_SOURCES,
    PREFIX,
    Policy,
    Setting,
    Source,
    format_value,
)
from webhook.problems import Problem

KIND = "TrainJob"
#: The runtime patch the webhook owns (a domain-prefixed path, as Trainer requires of a
#: manager: ``IsDomainPrefixedPath`` in its JobSet plugin's ``Validate``).
MANAGER = "retry-policy.dev/webhook"
CARRIED = PREFIX + "defaults"
#: ``+kubebuilder:validation:MaxItems=16`` on ``spec.runtimePatches``.
MAX_RUNTIME_PATCHES = 16
#: Why a retry-delay too long for Kueue is not capped on a TrainJob (``plan.queued``).
UNCAPPED = "the JobSet its trainer makes carries your annotations"
#: The field manager of the trainer's server-side apply (``reconcileObjects`` in
#: pkg/controller/trainjob_controller.go).
TRAINER_FIELD_MANAGER = "trainer"
#: The step, and the Job and container names, of the TrainJob's ``spec.trainer``
#: (``AncestorTrainer``, ``Node`` in pkg/constants/constants.go).
TRAINER_STEP = "trainer"
NODE = "node"
#: Steps that fetch a TrainJob's data and model before the trainer runs (``dependsOn``):
#: the policy, written for the training, is not theirs.
INITIALIZER_STEPS = ("dataset-initializer", "model-initializer")
#: What a TrainJob changes about the JobSet its trainer makes, as its controller owner
#: (``kinds/trainjob/__init__.py`` declares it: ``jobset.mutate.owned_by``): its initializers keep
#: their own retries, its deadline bounds the JobSet's restarts in place (checked at the
#: TrainJob's admission), and a TrainJob admitted as written (audited) has its JobSet
#: audited too (``_audit``).
JOBSET_OWNER = Owner(
    TRAINER_GROUP,
    ANCESTOR_LABEL,
    INITIALIZER_STEPS,
    "a TrainJob's initializers keep their own retries, the retry policy is the trainer's",
    bound="its TrainJob",
    bound_explained="its TrainJob's activeDeadlineSeconds, checked at the TrainJob's admission",
    audited_with_it=True,
)
#: The first Trainer release that merges ``resourcesPerNode`` into the runtime's resources,
#: per resource (``newRuntimeInfo`` with ``MergeResourceRequirements``); v2.2 replaced them
#: (``Builder.Trainer`` in pkg/runtime/framework/plugins/jobset/builder.go).
MERGES_RESOURCES = (2, 3)
#: The first release after the fix that keeps a failed TrainJob failed (kubeflow/trainer
#: #3891, on master after v2.3.0): before it, a failed TrainJob whose JobSet is deleted
#: gets a new one (docs/trainjob.md).
KEEPS_FAILED = (2, 4)
#: Lists merged item by item, by these keys: their ``x-kubernetes-list-map-keys`` in the
#: JobSet CRD v0.11.1 and the TrainJob CRD v2.2.0 (server-side apply), which are also the
#: ``patchMergeKey`` of the Kubernetes types a JobTemplateSpec holds (strategic merge
#: patch; but topologySpreadConstraints, merged by topologyKey alone there: nothing the
#: policy reads). Every other list is atomic: replaced whole.
LIST_KEYS: dict[str, tuple[str, ...]] = {
    "replicatedJobs": ("name",),
    "dependsOn": ("name",),
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "ports": ("containerPort", "protocol"),
    "imagePullSecrets": ("name",),
    "schedulingGates": ("name",),
    "resourceClaims": ("name",),
    "claims": ("name",),
    "volumeDevices": ("devicePath",),
    "hostAliases": ("ip",),
    "topologySpreadConstraints": ("topologyKey", "whenUnsatisfiable"),
    "conditions": ("type",),
    "ownerReferences": ("uid",),
    "runtimePatches": ("manager",),
}


# --- the TrainJob's runtime and the JobSet the trainer makes from it --------------------


def runtime_ref(trainjob: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(kind, group, name) of ``spec.runtimeRef``, with the CRD's defaults (kind
    ClusterTrainingRuntime, apiGroup trainer.kubeflow.org); ``None`` without a name."""
    ref = mapping(get_path(trainjob, ("spec", "runtimeRef")))
    name = ref.get("name")
    if not isinstance(name, str) or not name:
        return None
    kind = ref.get("kind") if isinstance(ref.get("kind"), str) else rt.CLUSTER_KIND
    group = ref.get("apiGroup") if isinstance(ref.get("apiGroup"), str) else TRAINER_GROUP
    return str(kind), str(group), name


def find_runtime(trainjob: Mapping[str, Any], ctx: Context) -> tuple[str, rt.RuntimeLookup]:
    """The TrainJob's runtime as ``ctx.runtimes`` knows it, and how to name it."""
    ref = runtime_ref(trainjob)
    if ref is None:
        return "its runtime", rt.RuntimeLookup(None, "spec.runtimeRef names no runtime")
    kind, group, name = ref
    namespace = mapping(trainjob.get("metadata")).get("namespace") or ctx.namespace
    label = rt.describe(kind, namespace, name)
    if group != TRAINER_GROUP or kind not in rt.PLURALS:
        return label, rt.RuntimeLookup(None, f"{group} {kind} is not a Kubeflow Trainer runtime")
    return label, ctx.runtimes.runtime(kind, namespace, name)


def strategic_merge(target: Any, patch: Any) -> Any:
    """``patch`` merged into ``target`` as a strategic merge patch of Kubernetes types
    does it (``strategicpatch.StrategicMergePatch``, which the trainer uses for a runtime
    patch's replicated Job template): mappings merged key by key, lists in ``LIST_KEYS``
    merged item by item, every other list and value replaced."""
    if not isinstance(target, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif key in LIST_KEYS and isinstance(value, list) and isinstance(target.get(key), list):
            merged[key] = _merge_list(target[key], value, LIST_KEYS[key])
        else:
            merged[key] = strategic_merge(target.get(key), value)
    return merged


def _merge_list(target: list[Any], patch: list[Any], keys: tuple[str, ...]) -> list[Any]:
    def key(item: Any) -> tuple | None:
        return tuple(item.get(k) for k in keys) if isinstance(item, dict) else None

    out = list(target)
    for item in patch:
        found = next((i for i, old in enumerate(out) if key(old) == key(item)), None)
        if found is None:
            out.append(copy.deepcopy(item))
        else:
            out[found] = strategic_merge(out[found], item)
    return out


def fields_v1(value: Any, name: str = "") -> dict[str, Any]:
    """The ``fieldsV1`` set of an applied configuration: the fields an applier owns
    (``f:<field>``, ``k:{...}`` for an item of a list with map keys, atomic lists whole)."""
    if isinstance(value, dict):
        return {f"f:{k}": fields_v1(v, k) for k, v in value.items()}
    if isinstance(value, list) and name in LIST_KEYS:
        owned: dict[str, Any] = {}
        for item in value:
            if isinstance(item, dict):
                item_key = {k: item.get(k) for k in LIST_KEYS[name] if k in item}
                entry = {".": {}, **fields_v1(item, "")}
                owned["k:" + json.dumps(item_key, separators=(",", ":"))] = entry
        return owned
    return {}


def resource_modes(trainer: str | None) -> tuple[bool, ...]:
    """How the Trainer release ``trainer`` gives ``resourcesPerNode`` to the JobSet:
    merged into the runtime's resources (True), in place of them (False), or either
    (``(False, True)``) when the release is not known."""
    release = rt.trainer_release(trainer)
    if release is None:
        return (False, True)
    return (release >= MERGES_RESOURCES,)


def node_resources(
    current: Mapping[str, Any], per_node: Mapping[str, Any], merged: bool
) -> dict[str, Any]:
    """The resources of the trainer's ``node`` container given ``spec.trainer.
    resourcesPerNode``. Merged (v2.3): limits and requests key by key over the runtime's
    (``MergeResourceRequirements``, a strategic merge patch), and only those two are
    applied. Replaced (v2.2): when resourcesPerNode has limits or requests, the container
    gets exactly those (``WithResources`` in ``Builder.Trainer``)."""
    if merged:
        out: dict[str, Any] = {}
        for part in ("limits", "requests"):
            values = {**mapping(current.get(part)), **mapping(per_node.get(part))}
            if values:
                out[part] = values
        return out
    given = [p for p in ("limits", "requests") if isinstance(per_node.get(p), dict)]
    if not given:
        return dict(current)
    return {part: copy.deepcopy(per_node[part]) for part in given}


def _trainer_steps(
    spec: dict[str, Any], trainjob: Mapping[str, Any], runtime: Mapping[str, Any], merged: bool
) -> None:
    """What the trainer writes into the replicated Jobs from ``spec.trainer`` and the
    runtime's ``mlPolicy``, as far as the policy reads it:

    - pods: every replicated Job runs ``count`` pods (parallelism = completions,
      ``JobSet.Build``; ``SyncParallelCount`` in v2.3): its parallelism, the mlPolicy's
      ``numNodes`` for the trainer step, then the TrainJob's ``numNodes`` for the trainer
      step, or, under MPI, for the ``node`` Job (less the launcher with
      ``runLauncherAsNode``: ``MPI.EnforceMLPolicy``); one replica of the trainer's and
      the initializers' Jobs (``Builder.Trainer``, ``Builder.Initializer``);
    - resources: ``resourcesPerNode`` on the ``node`` container of the trainer step (v2.3:
      when the runtime has an mlPolicy) and, under MPI with ``runLauncherAsNode``, of the
      ``node`` Job (``node_resources``)."""
    ml = get_path(runtime, ("spec", "mlPolicy"))
    ml = ml if isinstance(ml, dict) else None
    mpi = mapping(ml).get("mpi")
    launcher_as_node = isinstance(mpi, dict) and mpi.get("runLauncherAsNode") is True
    trainer = mapping(get_path(trainjob, ("spec", "trainer")))
    nodes = trainer.get("numNodes")
    nodes = nodes if isinstance(nodes, int) and not isinstance(nodes, bool) else None
    per_node = trainer.get("resourcesPerNode")
    for rjob in items(spec.get("replicatedJobs")):
        job_spec = get_path(rjob, ("template", "spec"))
        if not isinstance(rjob, dict) or not isinstance(job_spec, dict):
            continue
        ancestor = mapping(get_path(rjob, ("template", "metadata", "labels"))).get(ANCESTOR_LABEL)
        name = rjob.get("name")
        count = pod_count(job_spec.get("parallelism"), 1)
        if ancestor == TRAINER_STEP and ml is not None:
            count = pod_count(ml.get("numNodes"), 1)
        if nodes is not None and isinstance(mpi, dict):
            if name == NODE:
                count = max(nodes - 1, 1) if launcher_as_node else nodes
        elif nodes is not None and ancestor == TRAINER_STEP:
            count = nodes
        job_spec["parallelism"] = job_spec["completions"] = count
        if ancestor in (TRAINER_STEP, *INITIALIZER_STEPS):
            rjob["replicas"] = 1
        trainer_node = ancestor == TRAINER_STEP and (ml is not None or not merged)
        if isinstance(per_node, dict) and (trainer_node or (launcher_as_node and name == NODE)):
            for container in items(get_path(job_spec, ("template", "spec", "containers"))):
                if isinstance(container, dict) and container.get("name") == NODE:
                    resources = node_resources(
                        mapping(container.get("resources")), per_node, merged
                    )
                    if resources:
                        container["resources"] = resources
                    else:
                        container.pop("resources", None)
                    break


def jobset_for(
    trainjob: Mapping[str, Any], runtime: Mapping[str, Any], merged: bool = True
) -> dict[str, Any]:
    """The JobSet the trainer applies for ``trainjob`` from ``runtime``, as its admission
    sees it on CREATE (before any webhook): named after the TrainJob, with the runtime
    template's labels and annotations then each runtime patch's (``newRuntimeInfo``), the
    runtime's spec with each patch's replicated Job templates merged in
    (``mergeRuntimePatches``), the trainer's pod counts and ``resourcesPerNode``
    (``_trainer_steps``; ``merged``: as v2.3 gives resources, else as v2.2), the
    TrainJob's ``suspend``, a controller reference to the TrainJob, and the trainer's
    managedFields (operation Apply), which tell the fields it wrote from those the API
    defaulted (``JobSet.Build`` in pkg/runtime/framework/plugins/jobset/jobset.go). What
    the policy never reads (images, commands, env, ports, volumes) is not reproduced."""
    template = mapping(get_path(runtime, ("spec", "template")))
    meta = mapping(trainjob.get("metadata"))
    labels = dict(mapping(get_path(template, ("metadata", "labels"))))
    annotations = dict(mapping(get_path(template, ("metadata", "annotations"))))
    spec = copy.deepcopy(mapping(template.get("spec")))
    for patch in items(get_path(trainjob, ("spec", "runtimePatches"))):
        patched = mapping(get_path(patch, ("trainingRuntimeSpec", "template")))
        labels.update(mapping(get_path(patched, ("metadata", "labels"))))
        annotations.update(mapping(get_path(patched, ("metadata", "annotations"))))
        for rjob_patch in items(get_path(patched, ("spec", "replicatedJobs"))):
            job_patch = mapping(rjob_patch).get("template")
            if not isinstance(job_patch, dict):
                continue
            for rjob in items(spec.get("replicatedJobs")):
                if isinstance(rjob, dict) and rjob.get("name") == mapping(rjob_patch).get("name"):
                    rjob["template"] = strategic_merge(mapping(rjob.get("template")), job_patch)
    _trainer_steps(spec, trainjob, runtime, merged)
    suspend = get_path(trainjob, ("spec", "suspend"))
    if isinstance(suspend, bool):
        spec["suspend"] = suspend
    applied: dict[str, Any] = {"name": meta.get("name"), "namespace": meta.get("namespace")}
    if labels:
        applied["labels"] = labels
    if annotations:
        applied["annotations"] = annotations
    applied["ownerReferences"] = [
        {
            "apiVersion": f"{TRAINER_GROUP}/{rt.VERSION}",
            "kind": KIND,
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    fields = fields_v1({"metadata": applied, "spec": spec})
    managed = {
        "manager": TRAINER_FIELD_MANAGER,
        "operation": "Apply",
        "apiVersion": JOBSET_API_VERSION,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }
    metadata = {**applied, "managedFields": [managed]}
    return {"apiVersion": JOBSET_API_VERSION, "kind": "JobSet", "metadata": metadata, "spec": spec}


# --- the runtime patch the webhook owns -------------------------------------------------


def carried_defaults(ctx: Context, skipped: frozenset[str] = frozenset()) -> str | None:
    """The admin defaults in force for the TrainJob's namespace, in annotation grammar
    (``policy.parse_carried_defaults``); ``None`` when the config has neither defaults nor
    guard rails for it (``{}`` with guard rails only: the JobSet must still be judged).
    ``skipped``: defaults the TrainJob's admission found could not apply to it."""
    if not ctx.config.affects_unannotated(ctx.namespace):
        return None
    carried: dict[str, dict[str, str]] = {}
    for layer in ctx.config.layers(ctx.namespace):
        source = "namespace" if layer.source is Source.NAMESPACE else "cluster"
        carried[source] = {
            k: format_value(k, v) for k, v in sorted(layer.values.items()) if k not in skipped
        }
    ordered = {s: carried[s] for s in CARRIED_SOURCES if s in carried}
    return json.dumps(ordered, separators=(",", ":"))


def our_patch(
    trainjob: Mapping[str, Any], ctx: Context, skipped: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The runtime patch that carries the policy: the TrainJob's own ``retry-policy.dev/``
    annotations (not ``applied`` nor ``defaults``, which the webhook writes) and the
    carried defaults."""
    annotations = mapping(mapping(trainjob.get("metadata")).get("annotations"))
    carried = {
        k: v
        for k, v in sorted(annotations.items())
        if isinstance(k, str) and k.startswith(PREFIX) and k not in (APPLIED, CARRIED)
    }
    defaults = carried_defaults(ctx, skipped)
    if defaults is not None:
        carried[CARRIED] = defaults
    return {
        "manager": MANAGER,
        "trainingRuntimeSpec": {"template": {"metadata": {"annotations": carried}}},
    }


def find_our_patch(patches: Sequence[Any]) -> int | None:
    return next(
        (i for i, p in enumerate(patches) if isinstance(p, dict) and p.get("manager") == MANAGER),
        None,
    )


def _same_patch(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Equal but for ``time``, which Trainer's own defaulter writes (observability only)."""
    return {k: v for k, v in current.items() if k != "time"} == wanted


def _place(spec: dict[str, Any], entry: dict[str, Any]) -> str | None:
    """Put ``entry`` into ``spec.runtimePatches``; what changed (``None``: nothing), or
    raise ``ValueError`` when the list has no room."""
    patches = spec.get("runtimePatches")
    patches = list(patches) if isinstance(patches, list) else []
    index = find_our_patch(patches)
    if index is not None:
        if _same_patch(patches[index], entry):
            return None
        patches[index] = entry
        spec["runtimePatches"] = patches
        return "replaced"
    if len(patches) >= MAX_RUNTIME_PATCHES:
        raise ValueError(len(patches))
    spec["runtimePatches"] = [*patches, entry]
    return "added"


# --- the mutator ------------------------------------------------------------------------


#: A JobSet field in a message (``spec.x``, "your spec.x"), not one inside another path.
_JOBSET_FIELD = re.compile(r"(?<![\w.\[/])(?:your )?spec\.")


def _on_runtime(problem: Problem, label: str, resources: str = "") -> Problem:
    """A problem found on the JobSet, named for the TrainJob's user: a field of the JobSet
    is one of the runtime's template (``spec.x`` is ``<runtime>: spec.template.spec.x``),
    not "your spec". ``resources`` says where the node container's resources came from
    when the TrainJob's ``resourcesPerNode`` reached it (a memory problem may be there)."""
    where = problem.where
    if where.startswith("spec."):
        where = f"{label}: spec.template.{where}"
    message = problem.message.replace(" in your spec", "")
    message = _JOBSET_FIELD.sub(f"{label}: spec.template.spec.", message)
    if resources and "memory" in message:
        message = f"{message} ({resources})"
    if label not in f"{where} {message}":
        message = f"{message} (the JobSet made from {label})"
    return Problem(where, message, problem.reason)


def _resources_origin(trainjob: Mapping[str, Any], merged: bool | None) -> str:
    """Where the node container's resources come from, when ``resourcesPerNode`` is set
    (``merged`` ``None``: either way)."""
    if not isinstance(get_path(trainjob, ("spec", "trainer", "resourcesPerNode")), dict):
        return ""
    how = {
        True: " over the runtime's, as Trainer v2.3 does",
        False: " instead of the runtime's, as Trainer v2.2 does",
        None: "",
    }[merged]
    return f"the node container gets spec.trainer.resourcesPerNode{how}"


def _release_words(merged: bool) -> str:
    return "v2.3 (resourcesPerNode merged)" if merged else "v2.2 (resourcesPerNode replacing)"


def _spared(trainjob: Mapping[str, Any], ctx: Context) -> bool:
    """Whether the namespace audits and nobody opted this TrainJob in: no
    ``retry-policy.dev/`` annotation of its own, nor on its runtime's template (which its
    JobSet carries: an opt-in for every TrainJob of that runtime), when that is known."""
    if ctx.config.rollout_of(ctx.namespace) != AUDITED:
        return False
    if asks_for_policy(trainjob.get("metadata")):
        return False
    runtime = find_runtime(trainjob, ctx)[1].runtime
    return not asks_for_policy(get_path(mapping(runtime), ("spec", "template", "metadata")))


def _annotated(policy: Policy) -> Setting | None:
    """A setting the user annotated: the runtime patch carries it, so the validating
    webhook denies a TrainJob whose patch is missing (``engine._unapplied``)."""
    return next((s for s in policy.settings.values() if s.source is Source.ANNOTATION), None)


class TrainJobMutator(WorkloadMutator):
    group = TRAINER_GROUP
    kind = KIND
    #: The answer depends on the runtime, not on the TrainJob alone: never remembered.
    remember = False

    def mutate(self, trainjob: dict[str, Any], ctx: Context) -> Outcome:
        if self.applies(trainjob, ctx) and _spared(trainjob, ctx):
            return self._audit(trainjob, ctx)
        out = self._mutate(trainjob, ctx)
        policy = out.policies.get("spec")
        if policy is not None and not out.problems:
            # The JobSet its trainer makes gets the record (``kinds.audit``).
            audit.label_carried(trainjob.get("metadata"), policy, ctx, out)
        return out

    def _audit(self, trainjob: dict[str, Any], ctx: Context) -> Outcome:
        """Under ``rollout: audit``, a TrainJob nobody opted in (``_spared``): admitted with
        its spec as written (no runtime patch, so its JobSet gets no defaults) and never
        denied by the admin's config. What enforcing would do is its record: the
        admission run on a copy, enforced (a denial, guard rails included, is ``denied``);
        else, with the runtime known, the record the JobSet made from that copy gets at
        its admission (its parts and failurePolicy), or, without it, the settings. The
        JobSet the trainer makes records the same at its own admission
        (``jobset.mutate.owner_audited``), for the controller's replay."""
        out = Outcome()
        policy = self.policy(trainjob, ctx, Outcome())
        out.policies["spec"] = audit.without_defaults(policy)  # what applies: nothing
        settings, by = audit.held_back(policy)
        tried = copy.deepcopy(trainjob)
        denied = audit.say_enforced(self._mutate(tried, audit.enforcing(ctx)), out)
        record = AuditRecord(settings, by, denied=denied) if denied else None
        if not denied:
            _, found = find_runtime(tried, ctx)
            if found.runtime is not None:
                jobset = jobset_for(tried, found.runtime, resource_modes(found.trainer)[-1])
                judged = dataclasses.replace(ctx, operation="CREATE", outer_bound="the TrainJob")
                record = JobSetMutator().mutate(jobset, judged).audited
            elif settings:
                record = AuditRecord(settings, by)
        out.audited = record
        if record is not None:
            out.changed(audit.audit_text(record, audit.rollout_where(ctx)))
        audit.write(trainjob.get("metadata"), record, False, out)
        return out

    def _mutate(self, trainjob: dict[str, Any], ctx: Context) -> Outcome:
        out = Outcome()
        if not self.applies(trainjob, ctx):
            return out
        spec = trainjob.get("spec")
        if not isinstance(spec, dict):
            out.problems.append(Problem("spec", "a TrainJob needs a spec"))
            return out
        policy = self.policy(trainjob, ctx, out)
        out.policies["spec"] = policy
        # Kueue queues the TrainJob, not the JobSet its trainer makes: checked here.
        queued.check(
            policy, queued.queue_of(trainjob, ("spec",)), ctx, out, None, uncapped=UNCAPPED
        )
        if out.problems:
            # The needs between the valid keys are said with them: one apply shows all.
            failureaware.lacks_limit(policy, out)
            causes.check(policy, out)
            return out
        changed_spec = copy.deepcopy(spec)
        label, found = find_runtime(trainjob, ctx)
        skipped: frozenset[str] = frozenset()
        if policy.in_place_exit_codes:
            bounded = _bound_in_place(trainjob, changed_spec, found.runtime, policy, ctx, out)
            if not bounded.in_place_exit_codes:  # a default that could not apply
                skipped = frozenset({"in-place-exit-codes"})
            policy = bounded
        entry = our_patch(trainjob, ctx, skipped)
        try:
            placed = _place(changed_spec, entry)
        except ValueError:
            out.problems.append(
                Problem(
                    "spec.runtimePatches",
                    f"has {MAX_RUNTIME_PATCHES} entries, the most Kubeflow Trainer allows; "
                    f"the policy needs one of its own ({MANAGER}): remove one",
                    "too-many-runtime-patches",
                )
            )
            return out
        if found.runtime is not None:
            unbounded = self._judge_jobset(
                {**trainjob, "spec": changed_spec}, found.runtime, found.trainer, label, ctx, out
            )
            _check_ttl(found, out)
        else:
            out.policies["spec"] = inplace.check_version(check_unsupported(policy, out), ctx, out)
            resolved = out.policies["spec"]
            unbounded = [
                ending
                for ending, on in (
                    (UNBOUNDED, resolved.ignore_disruptions and resolved.max_disruptions is None),
                    (PEERS_UNBOUNDED, resolved.peer_disruptions == "ignore"),
                    (
                        FREE_UNBOUNDED,
                        bool(resolved.free_categories) and resolved.max_free_failures is None,
                    ),
                )
                if on
            ]
            out.note(
                f"retry-policy: {label} not read ({found.reason}): the policy is checked "
                "against it when the trainer creates the JobSet (a denial then shows in "
                "kubectl describe trainjob)"
            )
            nodes = get_path(changed_spec, ("trainer", "numNodes"))
            note_peers(out.policies["spec"], pod_count(nodes, 1), out)
        if changed_spec.get("activeDeadlineSeconds") is None:
            # The trainer fails the TrainJob at its deadline (KEP-2899), whatever its Jobs'.
            for ending in unbounded:
                out.note(unbounded_note("spec.activeDeadlineSeconds", ending))
        if out.problems or changed_spec == spec:
            return out
        trainjob["spec"] = changed_spec
        if placed is not None:
            # First: the change the validating webhook requires (``engine._unapplied``).
            text = (
                f"retry-policy: spec.runtimePatches: {placed} {MANAGER}, carrying the "
                "retry-policy annotations to the JobSet"
            )
            out.changes.insert(0, Change(text, _annotated(policy)))
        return out

    def _judge_jobset(
        self,
        trainjob: Mapping[str, Any],
        runtime: Mapping[str, Any],
        trainer: str | None,
        label: str,
        ctx: Context,
        out: Outcome,
    ) -> list[str]:
        """Run the JobSet mutator on the JobSet the trainer will make: its problems are
        the TrainJob's, its changes said as what the JobSet will get. When the Trainer's
        release is not known and the two ways it may give ``resourcesPerNode`` make
        different JobSets, both are judged: what both deny is denied, what one denies is
        a warning naming that release. Returns the endings of the warnings that one of its
        Jobs ignores disruptions (or peers) without a deadline of its own
        (``unbounded_note``): the JobSet's names a field of the runtime, the TrainJob's
        user is told of its own."""
        built: list[tuple[bool, dict[str, Any]]] = []
        for merged in resource_modes(trainer):
            jobset = jobset_for(trainjob, runtime, merged)
            if not any(jobset == other for _, other in built):
                built.append((merged, jobset))
        # (In-place restarts' deadline was checked on the TrainJob: ``_bound_in_place``.)
        jobset_ctx = dataclasses.replace(ctx, operation="CREATE", outer_bound="the TrainJob")
        judged = [(merged, JobSetMutator().mutate(jobset, jobset_ctx)) for merged, jobset in built]
        said = [[str(p) for p in outcome.problems] for _, outcome in judged]
        # What every build denies is denied (its resources said as the release gives them,
        # or in general when either may); what one denies is said with its release.
        origin = _resources_origin(trainjob, judged[0][0] if len(judged) == 1 else None)
        for problem in judged[0][1].problems:
            if all(str(problem) in others for others in said[1:]):
                out.problems.append(_on_runtime(problem, label, origin))
        for merged, outcome in judged if len(judged) > 1 else []:
            for problem in outcome.problems:
                if not all(str(problem) in others for others in said):
                    shown = _on_runtime(problem, label, _resources_origin(trainjob, merged))
                    out.note(
                        f"retry-policy: Trainer's release is not known; under "
                        f"{_release_words(merged)} the JobSet would be denied: {shown}"
                    )
        unbounded: list[str] = []
        for _, outcome in reversed(judged):  # the newest release's first
            for change in outcome.changes:
                text = f"retry-policy: JobSet: {change.text.removeprefix('retry-policy: ')}"
                if text not in (c.text for c in out.changes):
                    out.changed(text)
            for note in outcome.notes:
                endings = (UNBOUNDED, PEERS_UNBOUNDED, FREE_UNBOUNDED)
                ending = next((e for e in endings if note.endswith(e)), "")
                if ending:
                    unbounded += [ending] if ending not in unbounded else []
                elif note not in out.notes:
                    out.note(note)
                    if note in outcome.skipped:  # (what an audit says now: ``_audit``)
                        out.skipped.append(note)
        out.policies.update({f"jobset.{k}": v for k, v in judged[-1][1].policies.items()})
        return unbounded

    def restore(self, trainjob: dict[str, Any], old: Mapping[str, Any], ctx: Context) -> list[str]:
        """On UPDATE: the webhook's runtime patch as it was, at its place, when the update
        left it out or changed it (Trainer refuses a changed runtimePatches while the
        TrainJob runs; the JobSet it made carries the old one anyway)."""
        old_patches = items(get_path(old, ("spec", "runtimePatches")))
        index = find_our_patch(old_patches)
        spec = trainjob.get("spec")
        if index is None or not isinstance(spec, dict):
            return []
        entry = old_patches[index]
        patches = list(items(spec.get("runtimePatches")))
        mine = find_our_patch(patches)
        if mine is not None and patches[mine] == entry:
            return []
        patches = [p for p in patches if not (isinstance(p, dict) and p.get("manager") == MANAGER)]
        patches.insert(min(index, len(patches)), copy.deepcopy(entry))
        spec["runtimePatches"] = patches
        return [
            f"retry-policy: spec.runtimePatches: kept {MANAGER} as it was (it carries the "
            "policy the TrainJob's JobSet was made with)"
        ]


#: Said when the runtime deletes finished JobSets (``_check_ttl``).
TTL_NOTE = (
    "retry-policy: the runtime's ttlSecondsAfterFinished makes Trainer rerun failed TrainJobs "
    "(kubeflow/trainer#3779)"
)


def _check_ttl(found: rt.RuntimeLookup, out: Outcome) -> None:
    """A runtime whose JobSets are deleted when finished: up to Trainer v2.3 the trainer
    then makes a failed TrainJob a new JobSet, whose budget starts over, and runs a TrainJob
    ``fail-non-retriable`` failed again (the reconcile clears the Failed condition before
    it checks whether the TrainJob is finished: kubeflow/trainer#3779, fixed by #3891)."""
    ttl = get_path(found.runtime, ("spec", "template", "spec", "ttlSecondsAfterFinished"))
    release = rt.trainer_release(found.trainer)
    if ttl is not None and (release is None or release < KEEPS_FAILED):
        out.note(TTL_NOTE)


def _bound_in_place(
    trainjob: Mapping[str, Any],
    spec: dict[str, Any],
    runtime: Mapping[str, Any] | None,
    policy: Policy,
    ctx: Context,
    out: Outcome,
) -> Policy:
    """In-place restarts need a deadline: the TrainJob's own (the trainer fails the
    TrainJob and deletes its JobSet when it passes: ``reconcileDeadline``), or one on every
    replicated Job of its runtime; else the admin's default, written here (the field is
    immutable after creation), or the admin's permission to run unbounded."""
    present = inplace.deadline_set(spec.get("activeDeadlineSeconds"))
    if not present and runtime is not None:
        # Each replicated Job that restarts in place (not the initializers: they take no
        # policy) must be bounded as the JobSet webhook judges it: a deadline the
        # runtime's JobSet rules restart past uncounted is none (``in_place_bound``).
        jobset = jobset_for({**trainjob, "spec": spec}, runtime)
        skipped = set(initializers(jobset))
        bounds = [
            in_place_bound(jobset, path, mapping(get_path(jobset, path)), None).present
            for index, _ in enumerate(items(get_path(jobset, ("spec", "replicatedJobs"))))
            if index not in skipped
            for path in [("spec", "replicatedJobs", index, "template", "spec")]
        ]
        present = bool(bounds) and all(bounds)
    fields = "spec.activeDeadlineSeconds (or one on every replicated Job of the runtime)"
    policy, deadline = inplace.settle_bound(
        policy, inplace.Bound(present, fields), ctx, out, "no retry budget"
    )
    if deadline is not None:
        in_place_rules.write_deadline(
            spec, "activeDeadlineSeconds", deadline, "spec.activeDeadlineSeconds", out
        )
    return policy
