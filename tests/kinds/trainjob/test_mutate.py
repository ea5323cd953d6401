"""Kubeflow Trainer v2 TrainJob: the policy reaches the JobSet the trainer makes, is
judged at the TrainJob's admission against its runtime, and survives the trainer's
re-apply of that JobSet.

Upstream behaviour these tests pin (kubeflow/trainer v2.2.0, JobSet v0.11.1):

- ``newRuntimeInfo`` (pkg/runtime/core/trainingruntime.go): the JobSet's annotations are
  the runtime template's, then each ``spec.runtimePatches[]`` entry's
  ``trainingRuntimeSpec.template.metadata.annotations`` in order; a patch's replicated Job
  template is merged with ``strategicpatch.StrategicMergePatch`` (``mergeRuntimePatches``).
- ``JobSet.Build`` (pkg/runtime/framework/plugins/jobset/jobset.go): the JobSet is named
  after the TrainJob, owned by it (controller), applied with server-side apply by field
  manager ``trainer`` with force (``reconcileObjects`` in pkg/controller/
  trainjob_controller.go), again whenever the TrainJob or its JobSet is suspended.
- ``checkRuntimePatchesImmutability``: runtimePatches may change only while suspended.
- JobSet's ``jobSetWebhook.Default`` (CREATE only) and ``ValidateUpdate`` (replicatedJobs
  immutable but for pod template labels, annotations, nodeSelector, tolerations and
  schedulingGates while suspended); ``failurePolicy`` immutable by CEL.
"""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

import pytest
import yaml

from testkit import ssa
from testkit.builders import FULL, P
from testkit.tools import ROOT
from testkit.trainer import (
    ANCESTOR_LABEL,
    GPU,
    OOM,
    RUNTIMES,
    TRAINER,
    carried,
    memory_runtime,
    mutate,
    runtime,
    shipped,
    submitted,
    trainjob,
    validate,
)
from testkit.workloads import crd_defaults, crd_schema, kubectl_patch, validate_schema
from webhook.admission import engine
from webhook.cluster.runtimes import NoRuntimes
from webhook.kinds import registry
from webhook.kinds.jobset import mutate as jobset_mutate
from webhook.kinds.jobset.rules import our_rule
from webhook.kinds.trainjob.mutate import (
    INITIALIZER_STEPS,
    JOBSET_OWNER,
    KIND,
    LIST_KEYS,
    MANAGER,
    TTL_NOTE,
    jobset_for,
    our_patch,
    resource_modes,
)
from webhook.kinds.trainjob.runtimes import GivenRuntimes
from webhook.kube.failurepolicy import (
    count_disruptions_rule,
    ignore_disruptions_rule,
    non_retriable_rule,
)
from webhook.kube.intent import LAST_APPLIED
from webhook.plan.outcome import Context
from webhook.policy.config import Config, parse_config

JOBSET = "jobset.x-k8s.io/v1alpha2"
#: The rule a runtime's JobSet template may have, and a child Job rule of the runtime's.
RUNTIME_RULE = {
    "name": "failOnDeadline",
    "action": "FailJobSet",
    "onJobFailureReasons": ["DeadlineExceeded"],
}
TEMPFAIL_RULE = {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [75]}}


# --- the TrainJob's own admission --------------------------------------------------------


def test_the_job_examples_annotations_reach_the_runtime_patch(tmp_path):
    """Annotated like examples/job.yaml: the mutating webhook adds one runtime patch of its
    own carrying exactly the retry-policy annotations; applied with Go's json-patch, the
    TrainJob matches Trainer's CRD schema; a second run changes nothing; validation
    accepts it."""
    runtimes = GivenRuntimes([runtime()])
    obj = trainjob(FULL)
    verdict, out = mutate(obj, runtimes)
    assert verdict.allowed, verdict.message
    assert out["spec"]["runtimePatches"] == [
        {
            "manager": MANAGER,
            "trainingRuntimeSpec": {"template": {"metadata": {"annotations": FULL}}},
        }
    ]
    assert kubectl_patch(obj, verdict.patch, tmp_path) == out
    validate_schema(out)
    again, twice = mutate(out, runtimes)
    assert again.allowed and again.patch == [] and twice == out
    assert validate(out, runtimes).allowed
    # What the JobSet will get is said on apply.
    assert any(
        "retry-policy: JobSet: spec.failurePolicy.maxRestarts -> 3" in w for w in verdict.warnings
    )


def test_patches_of_others_are_kept_and_ours_goes_last():
    """``newRuntimeInfo`` applies patches in list order (a later one wins a key): the
    webhook appends its own after the user's and Kueue's, leaving theirs untouched."""
    theirs = [
        {
            "manager": "example.com/team",
            "trainingRuntimeSpec": {"template": {"metadata": {"labels": {"team": "a"}}}},
        },
        {"manager": "kueue.x-k8s.io/manager", "time": "2026-11-25T00:00:01Z"},
    ]
    _, out = mutate(trainjob(FULL, patches=theirs), GivenRuntimes([runtime()]))
    assert out["spec"]["runtimePatches"][:2] == theirs
    assert out["spec"]["runtimePatches"][2]["manager"] == MANAGER


def test_runtime_patches_has_room_for_sixteen_only():
    full = [{"manager": f"example.com/p{i}"} for i in range(16)]
    verdict, _ = mutate(trainjob(FULL, patches=full), GivenRuntimes([runtime()]))
    assert not verdict.allowed
    assert (
        "spec.runtimePatches: has 16 entries, the most Kubeflow Trainer allows" in verdict.message
    )
    verdict, out = mutate(trainjob(FULL, patches=full[:15]), GivenRuntimes([runtime()]))
    assert verdict.allowed and len(out["spec"]["runtimePatches"]) == 16


def test_trainer_v2_2_has_no_spec_annotations():
    """v2.0 and v2.1 had ``spec.annotations`` for the derivative JobSet; v2.2 removed it
    (the CRD schema, strict as ``fieldValidation=Strict``, refuses it)."""
    obj = trainjob(FULL)
    obj["spec"]["annotations"] = dict(FULL)
    with pytest.raises(AssertionError, match="annotations"):
        validate_schema(obj)


@pytest.mark.parametrize(
    "runtimes", [GivenRuntimes([runtime()]), NoRuntimes()], ids=["runtime", "none"]
)
def test_a_bad_value_is_denied_on_apply(runtimes):
    """Denied at the TrainJob's admission, runtime known or not (not later, on the
    trainer's JobSet create, where only an Event would say it)."""
    obj = trainjob({**FULL, P + "backoff-limit": "three"})
    verdict = validate(obj, runtimes)
    assert not verdict.allowed
    assert "annotation retry-policy.dev/backoff-limit" in verdict.message
    assert "'three' is not valid; accepted: a whole number" in verdict.message
    assert not mutate(obj, runtimes)[0].allowed


def test_a_bad_value_comes_with_the_needs_of_the_other_keys():
    """Every problem at once: a bad value does not hide what another key needs."""
    obj = trainjob(
        {P + "backoff-limit": "x", P + "oom-memory-factor": "1.5", P + "max-disruptions": "2"}
    )
    message = mutate(obj, GivenRuntimes([runtime()]))[0].message
    assert message.startswith("retry-policy: 3 problems: ")
    assert f"annotation {P}backoff-limit: 'x' is not valid" in message
    assert f"annotation {P}oom-memory-factor: needs {P}oom-memory-limit" in message
    assert f"annotation {P}max-disruptions: needs ignore-disruptions, not set" in message


def test_what_no_jobset_can_honour_is_denied_without_the_runtime():
    """error-propagation (PyTorchJob only) and fail-index: the JobSet could not either."""
    obj = trainjob(
        {**FULL, P + "error-propagation": "earliest", P + "on-non-retriable": "fail-index"}
    )
    verdict = validate(obj)
    assert not verdict.allowed
    assert "retry-policy.dev/error-propagation: cannot apply to a JobSet" in verdict.message
    assert "retry-policy.dev/on-non-retriable: cannot apply to a JobSet" in verdict.message


def test_without_the_runtime_the_patch_is_added_and_the_check_deferred():
    verdict, out = mutate(trainjob(FULL))
    assert verdict.allowed
    assert carried(out) == FULL
    assert any(
        "ClusterTrainingRuntime torch-distributed not read (no connection to a cluster)" in w
        for w in verdict.warnings
    )


RT = "ClusterTrainingRuntime torch-distributed: spec.template."


@pytest.mark.parametrize(
    ("rt", "where", "on_trainjob", "on_jobset"),
    [
        (
            runtime(failure_policy={"maxRestarts": 5}),
            "annotation retry-policy.dev/backoff-limit",
            f"3 contradicts {RT}spec.failurePolicy.maxRestarts: 5; remove one",
            "3 contradicts spec.failurePolicy.maxRestarts: 5 in your spec",
        ),
        (
            runtime(pod_spec={"restartPolicy": "OnFailure"}),
            "annotation retry-policy.dev/fail-non-retriable and annotation "
            "retry-policy.dev/ignore-disruptions",
            f"{RT}spec.replicatedJobs[0].template.spec.template.spec.restartPolicy is OnFailure",
            "spec.replicatedJobs[0].template.spec.template.spec.restartPolicy is OnFailure",
        ),
        (
            runtime(
                failure_policy={
                    "rules": [
                        {
                            "name": "again",
                            "action": "RestartJobSet",
                            "onJobFailureReasons": ["PodFailurePolicy"],
                        }
                    ]
                }
            ),
            "annotation retry-policy.dev/fail-non-retriable",
            f"{RT}spec.failurePolicy.rules[0] (RestartJobSet) matches Jobs failed by their "
            "podFailurePolicy first",
            "your spec.failurePolicy.rules[0] (RestartJobSet) matches Jobs failed by their "
            "podFailurePolicy first",
        ),
        (
            runtime(failure_policy={"restartStrategy": "InPlaceRestart"}),
            "annotation retry-policy.dev/ignore-disruptions",
            "cannot apply to a JobSet: with restartStrategy InPlaceRestart any pod that fails, "
            "a disrupted one too, restarts the whole set in place, and JobSet counts that "
            "against maxRestarts (the JobSet made from ClusterTrainingRuntime torch-distributed)",
            "cannot apply to a JobSet",
        ),
    ],
    ids=["maxRestarts", "OnFailure", "restarting-rule", "in-place"],
)
def test_the_runtimes_template_is_judged_at_the_trainjobs_admission(
    rt, where, on_trainjob, on_jobset
):
    """What the JobSet's admission would deny is denied on the TrainJob's apply, naming
    the runtime's own fields (``<runtime>: spec.template.spec...``, not "your spec": the
    TrainJob's user did not write them): the JobSet mutator runs on the JobSet the trainer
    will make from it."""
    verdict = validate(trainjob(FULL), GivenRuntimes([rt]))
    assert not verdict.allowed
    assert f"{where}: {on_trainjob}" in verdict.message
    assert "your spec" not in verdict.message
    # The same JobSet, made by the trainer, would be denied at its own admission.
    _, mutated = mutate(trainjob(FULL))
    denied, _ = mutate(jobset_for(mutated, rt))
    assert not denied.allowed and f"{where}: {on_jobset}" in denied.message


def test_a_namespaced_runtime_is_found_in_the_trainjobs_namespace():
    rt = runtime(kind="TrainingRuntime", name="torch-spot", failure_policy={"maxRestarts": 5})
    ref = {"name": "torch-spot", "kind": "TrainingRuntime"}
    verdict, _ = mutate(trainjob(FULL, ref=ref), GivenRuntimes([rt]))
    assert not verdict.allowed and "TrainingRuntime ml/torch-spot" in verdict.message
    other = copy.deepcopy(rt)
    other["metadata"]["namespace"] = "other"
    verdict, _ = mutate(trainjob(FULL, ref=ref), GivenRuntimes([other]))
    assert verdict.allowed
    assert any("TrainingRuntime ml/torch-spot not read" in w for w in verdict.warnings)


def test_the_validating_webhook_denies_a_trainjob_the_mutating_one_missed():
    """Mutating webhook not installed or not reached: the policy would be silently lost."""
    verdict = validate(trainjob(FULL), GivenRuntimes([runtime()]))
    assert not verdict.allowed
    assert "the policy you annotated was not applied (spec.runtimePatches: added" in verdict.message
    _, out = mutate(trainjob(FULL), GivenRuntimes([runtime()]))
    assert validate(out, GivenRuntimes([runtime()])).allowed


def test_a_trainjob_ignoring_disruptions_is_told_to_set_its_own_deadline():
    """upstream: Trainer v2.2 fails a TrainJob past its spec.activeDeadlineSeconds and
    deletes its JobSet (KEP-2899); without one, a child Job whose disruptions are ignored
    ends only by its own deadline (pastActiveDeadline), a field of the runtime the
    TrainJob's user does not write. So the TrainJob's warning names its own field, in
    place of the JobSet's, and none is said when either deadline is set."""
    want = "retry-policy: set spec.activeDeadlineSeconds: ignored disruptions retry with no cap"
    annotations = {P + "ignore-disruptions": "true"}
    for runtimes in (GivenRuntimes([runtime()]), None):  # judged, or not read
        verdict, _ = mutate(trainjob(annotations), runtimes)
        assert verdict.allowed, verdict.message
        assert [w for w in verdict.warnings if "activeDeadlineSeconds" in w] == [want]
    bounded = trainjob(annotations)
    bounded["spec"]["activeDeadlineSeconds"] = 86400
    verdict, out = mutate(bounded, GivenRuntimes([runtime()]))
    assert verdict.allowed and not any("activeDeadlineSeconds" in w for w in verdict.warnings)
    validate_schema(out)
    jobs_bounded = runtime(job_spec={"activeDeadlineSeconds": 3600})
    verdict, _ = mutate(trainjob(annotations), GivenRuntimes([jobs_bounded]))
    assert verdict.allowed and not any("activeDeadlineSeconds" in w for w in verdict.warnings)


def test_unannotated_trainjobs_are_left_alone():
    obj = trainjob()
    assert mutate(obj, GivenRuntimes([runtime()]))[0].patch in (None, [])
    assert validate(obj, GivenRuntimes([runtime()])).allowed


# --- the JobSet the trainer makes ----------------------------------------------------------


def test_the_jobset_carries_runtime_then_patch_annotations_in_order():
    """``newRuntimeInfo``: the runtime template's annotations, then each patch's; a later
    one wins a key. The webhook's patch comes last, so its annotations win."""
    rt = runtime(annotations={P + "backoff-limit": "9", "example.com/a": "1"})
    patches = [
        {
            "manager": "example.com/x",
            "trainingRuntimeSpec": {
                "template": {"metadata": {"annotations": {"example.com/a": "2"}}}
            },
        }
    ]
    _, out = mutate(trainjob(FULL, patches=patches), GivenRuntimes([rt]))
    jobset = jobset_for(out, rt)
    assert jobset["metadata"]["annotations"] == {**FULL, "example.com/a": "2"}
    owner = jobset["metadata"]["ownerReferences"]
    assert owner == [
        {
            "apiVersion": TRAINER,
            "kind": "TrainJob",
            "name": "llm-finetune",
            "uid": out["metadata"].get("uid"),
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def test_a_patchs_pod_template_is_merged_strategically():
    """``mergeRuntimePatches``: ``StrategicMergePatch`` on the JobTemplateSpec: containers
    merged by name, nodeSelector key by key, tolerations (no merge key) replaced."""
    rt = runtime(
        pod_spec={"nodeSelector": {"a": "1"}, "tolerations": [{"key": "x", "operator": "Exists"}]}
    )
    patch = {
        "manager": "kueue.x-k8s.io/manager",
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "nodeSelector": {"b": "2"},
                                            "tolerations": [{"key": "y", "operator": "Exists"}],
                                            "containers": [
                                                {
                                                    "name": "node",
                                                    "env": [{"name": "E", "value": "1"}],
                                                }
                                            ],
                                        }
                                    }
                                }
                            },
                        }
                    ]
                }
            }
        },
    }
    jobset = jobset_for(trainjob(patches=[patch]), rt)
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"a": "1", "b": "2"}
    assert pod["tolerations"] == [{"key": "y", "operator": "Exists"}]
    assert pod["containers"] == [
        {"name": "node", "image": "pytorch/pytorch:2.10.0", "env": [{"name": "E", "value": "1"}]}
    ]


def test_a_non_spot_pin_in_a_patch_is_judged_with_the_jobset():
    """A runtime patch that pins the pods to spot nodes contradicts non-spot-attempts."""
    spot = {"nodeSelector": {"karpenter.sh/capacity-type": "spot"}}
    patch = {
        "manager": "example.com/spot",
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {"name": "node", "template": {"spec": {"template": {"spec": spot}}}}
                    ]
                }
            }
        },
    }
    verdict = validate(trainjob(FULL, patches=[patch]), GivenRuntimes([runtime()]))
    assert not verdict.allowed
    assert (
        "retry-policy.dev/non-spot-attempts" in verdict.message
        and "requires spot nodes" in verdict.message
    )


# --- admin defaults: resolved at the TrainJob's admission, carried to the JobSet ----------

DEFAULTS = parse_config(
    """
defaults:
  fail-non-retriable: true
  retriable-exit-codes: [143, 137]
namespaces:
  ml:
    defaults:
      backoff-limit: 2
"""
)


def test_defaults_travel_in_the_runtime_patch_and_count_as_defaults():
    """A controller-made JobSet takes no defaults of its own admission (``default_layers``);
    the TrainJob's are carried in ``retry-policy.dev/defaults`` and resolved there with
    their sources (explain says "cluster default", not "annotation")."""
    obj = trainjob({P + "ignore-disruptions": "true"})
    verdict, out = mutate(obj, GivenRuntimes([runtime()]), DEFAULTS)
    assert verdict.allowed, verdict.message
    assert carried(out) == {
        P + "ignore-disruptions": "true",
        P + "defaults": '{"namespace":{"backoff-limit":"2"},"cluster":{"fail-non-retriable":'
        '"true","retriable-exit-codes":"137,143"}}',
    }
    # At the JobSet's admission, with no config of its own (or another one since).
    jobset = jobset_for(out, runtime())
    reviewed = engine.review(jobset, Config(), "ml")
    assert reviewed.verdict.allowed, reviewed.verdict.message
    policy = reviewed.outcome.policies["spec"]
    assert policy.setting("backoff-limit").source.value == "namespace default"
    assert policy.setting("backoff-limit").detail == "(ml)"
    assert policy.setting("fail-non-retriable").source.value == "cluster default"
    assert policy.setting("ignore-disruptions").source.value == "annotation"
    spec = reviewed.result["spec"]
    assert spec["failurePolicy"] == {"maxRestarts": 2, "rules": [our_rule()]}
    rules = spec["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"]
    assert rules == [ignore_disruptions_rule(), non_retriable_rule([137, 143], "FailJob", "node")]


def test_a_carried_default_that_cannot_apply_is_skipped_not_denied():
    """The runtime's pods restart in place (OnFailure): the default fail-non-retriable is
    skipped with a warning, on the TrainJob and on the JobSet; annotated, it is denied."""
    rt = runtime(pod_spec={"restartPolicy": "OnFailure"})
    verdict, out = mutate(trainjob({P + "backoff-limit": "3"}), GivenRuntimes([rt]), DEFAULTS)
    assert verdict.allowed, verdict.message
    assert any("fail-non-retriable (cluster default) skipped" in w for w in verdict.warnings)
    jobset_verdict, stored = mutate(jobset_for(out, rt), config=Config())
    assert jobset_verdict.allowed
    assert "podFailurePolicy" not in stored["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert any("skipped" in w for w in jobset_verdict.warnings)
    annotated = trainjob({P + "fail-non-retriable": "true"})
    assert not mutate(annotated, GivenRuntimes([rt]), DEFAULTS)[0].allowed


def test_guard_rails_reach_the_jobset_of_an_unannotated_trainjob():
    """With guard rails (and no defaults) every TrainJob is sent: its JobSet is judged
    against them, so a runtime's maxRestarts above the limit is denied on apply."""
    rails = parse_config("guardRails: {maxBackoffLimit: 3}\n")
    rt = runtime(failure_policy={"maxRestarts": 10})
    verdict, _ = mutate(trainjob(), GivenRuntimes([rt]), rails)
    assert not verdict.allowed
    assert "10 is above this cluster's limit; accepted: 0 to 3" in verdict.message
    verdict, out = mutate(trainjob(), GivenRuntimes([runtime()]), rails)
    assert verdict.allowed and carried(out) == {P + "defaults": "{}"}


def test_a_controller_made_jobset_ignores_the_live_config():
    """Without carried defaults, a JobSet owned by a TrainJob gets no cluster default."""
    _, out = mutate(trainjob({P + "backoff-limit": "3"}), GivenRuntimes([runtime()]))
    reviewed = engine.review(jobset_for(out, runtime()), DEFAULTS, "ml")
    policy = reviewed.outcome.policies["spec"]
    assert policy.setting("fail-non-retriable").source.value == "built-in default"
    assert reviewed.result["spec"]["failurePolicy"] == {"maxRestarts": 3}


# --- the trainer's re-apply of the JobSet ---------------------------------------------------

#: A runtime that owns lists the webhook adds to: JobSet rules and a child Job's
#: podFailurePolicy rules (its pods need restartPolicy Never for those).
RULES_RUNTIME = runtime(
    name="torch-rules",
    failure_policy={"rules": [RUNTIME_RULE]},
    job_spec={"podFailurePolicy": {"rules": [TEMPFAIL_RULE]}},
    pod_spec={"restartPolicy": "Never"},
)
KUEUE_SELECTOR = {"cloud.google.com/gke-nodepool": "a100-spot"}


def trainer_jobset(tj: dict[str, Any], rt: dict[str, Any], *, node_selector=None) -> dict:
    """The apply configuration ``JobSet.Build`` sends for ``tj`` (written out for the
    runtimes here): the runtime's template with the TrainJob's image and node count on
    the trainer's Job (``Trainer``: parallelism and completions = numNodes, one replica;
    1 pod elsewhere; one replica of an initializer's Job), the patches' annotations and
    pod template patches (Kueue's nodeSelector on admission), the TrainJob's suspend, a
    controller reference; no status, no defaults."""
    template = copy.deepcopy(rt["spec"]["template"]["spec"])
    for rjob in template["replicatedJobs"]:
        step = rjob["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR_LABEL)
        job_spec = rjob["template"]["spec"]
        job_spec["parallelism"] = job_spec["completions"] = 4 if step == "trainer" else 1
        if step in ("trainer", "dataset-initializer", "model-initializer"):
            rjob["replicas"] = 1  # ``Builder.Trainer``, ``Builder.Initializer``
        pod = job_spec["template"]["spec"]
        if step == "trainer":
            pod["containers"][0]["image"] = "ghcr.io/example/finetune:2.0.1"
        if node_selector:
            pod["nodeSelector"] = dict(node_selector)
    annotations: dict[str, str] = {}
    for patch in tj["spec"].get("runtimePatches") or []:
        meta = patch.get("trainingRuntimeSpec", {}).get("template", {}).get("metadata", {})
        annotations.update(meta.get("annotations") or {})
    owner = {
        "apiVersion": TRAINER,
        "kind": "TrainJob",
        "name": tj["metadata"]["name"],
        "uid": tj["metadata"].get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return {
        "apiVersion": JOBSET,
        "kind": "JobSet",
        "metadata": {
            "name": tj["metadata"]["name"],
            "namespace": "ml",
            "annotations": annotations,
            "ownerReferences": [owner],
        },
        "spec": {**template, "suspend": tj["spec"]["suspend"]},
    }


def jobset_defaults(obj: dict[str, Any]) -> None:
    """JobSet's own mutating webhook, on CREATE only (``jobSetWebhook.Default``, v0.11.1)."""
    spec = obj["spec"]
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    for rjob in spec["replicatedJobs"]:
        job_spec = rjob["template"]["spec"]
        job_spec.setdefault("completionMode", "Indexed")
        if not job_spec["template"]["spec"].get("restartPolicy"):
            job_spec["template"]["spec"]["restartPolicy"] = "OnFailure"
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    for index, rule in enumerate((spec.get("failurePolicy") or {}).get("rules") or []):
        rule.setdefault("name", f"failurePolicyRule{index}")


MUTABLE_WHILE_SUSPENDED = ("annotations", "labels")
MUTABLE_POD_FIELDS = ("nodeSelector", "tolerations", "schedulingGates")


def jobset_update_errors(new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """What JobSet refuses in an UPDATE: ``self == oldSelf`` (CEL) on failurePolicy,
    successPolicy, startupPolicy and network; ``ValidateUpdate`` on replicatedJobs, but
    for the pod templates' labels, annotations, nodeSelector, tolerations and
    schedulingGates when the old or the new JobSet is suspended (Kueue)."""
    errors = [
        f"spec.{field}: Value is immutable"
        for field in ("failurePolicy", "successPolicy", "startupPolicy", "network")
        if new["spec"].get(field) != old["spec"].get(field)
    ]
    munged = copy.deepcopy(new["spec"]["replicatedJobs"])
    if old["spec"].get("suspend") or new["spec"].get("suspend"):
        for rjob, before in zip(munged, old["spec"]["replicatedJobs"], strict=False):
            template, previous = (
                rjob["template"]["spec"]["template"],
                before["template"]["spec"]["template"],
            )
            for parent, fields in (
                (("metadata",), MUTABLE_WHILE_SUSPENDED),
                (("spec",), MUTABLE_POD_FIELDS),
            ):
                target, source = template.setdefault(parent[0], {}), previous.get(parent[0]) or {}
                for field in fields:
                    target.pop(field, None)
                    if field in source:
                        target[field] = copy.deepcopy(source[field])
            if not template["metadata"]:
                template.pop("metadata")
    if munged != old["spec"]["replicatedJobs"]:
        errors.append("spec.replicatedJobs: field is immutable")
    return errors


def admitted_trainjob(rt: dict[str, Any], config: Config | None = None) -> dict[str, Any]:
    """The TrainJob as stored: created suspended (Kueue holds it), mutated and validated."""
    obj = trainjob(FULL, suspend=True, ref={"name": rt["metadata"]["name"]})
    verdict, out = mutate(obj, GivenRuntimes([rt]), config)
    assert verdict.allowed, verdict.message
    assert validate(out, GivenRuntimes([rt]), config).allowed
    return out


def admit(obj, operation="CREATE", old=None) -> tuple[Any, dict[str, Any]]:
    """This mutating webhook, then the CRD's defaults again: the API server defaults a
    custom resource after each mutating webhook whose patch is not empty (and when it
    reads one from etcd), so a ``failurePolicy`` the webhook adds gets its
    ``restartStrategy: Recreate`` before it is stored."""
    verdict, out = mutate(obj, operation=operation, old=old)
    if verdict.patch:
        crd_defaults(crd_schema(out), out)
    return verdict, out


def create_jobset(tj, rt, order: str) -> tuple[dict[str, Any], dict[str, set]]:
    """The trainer's first apply: the API server computes managedFields from the applied
    configuration (manager ``trainer``), then runs mutating admission (JobSet's webhook
    and this one, in either order; ours is reinvoked, IfNeeded), then stores it."""
    config = trainer_jobset(tj, rt)
    managed = {"trainer": ssa.field_set(config)}
    obj = ssa.with_managed_fields(config, managed, JOBSET)
    crd_defaults(crd_schema(obj), obj)
    if order == "jobset-first":
        jobset_defaults(obj)
    verdict, obj = admit(obj)
    assert verdict.allowed, verdict.message
    if order == "ours-first":
        jobset_defaults(obj)
        again, obj = admit(obj)  # reinvoked: JobSet's webhook changed the object
        assert again.allowed and again.patch == []
    assert validate(obj).allowed
    validate_schema(obj)
    return obj, managed


def reapply(stored, managed, config) -> tuple[dict[str, Any], dict[str, set]]:
    """What the API server hands admission on the trainer's next apply: the stored
    JobSet with the configuration applied (``ssa.apply``), then defaulted."""
    merged, owners = ssa.apply(stored, managed, config, "trainer")
    merged = ssa.with_managed_fields(merged, owners, JOBSET)
    crd_defaults(crd_schema(merged), merged)
    return merged, owners


def update_admission(obj, old) -> tuple[Any, dict[str, Any]]:
    """The UPDATE through the mutating webhook, then the validating webhooks: ours and
    JobSet's (which must not refuse it)."""
    verdict, final = admit(obj, operation="UPDATE", old=old)
    assert verdict.allowed, verdict.message
    assert validate(final, operation="UPDATE", old=old).allowed
    return verdict, final


@pytest.mark.parametrize("order", ["jobset-first", "ours-first"])
def test_the_jobset_gets_the_policy_at_its_creation(order):
    tj = admitted_trainjob(RULES_RUNTIME)
    stored, _ = create_jobset(tj, RULES_RUNTIME, order)
    spec = stored["spec"]
    assert spec["failurePolicy"] == {
        "restartStrategy": "Recreate",
        "maxRestarts": 3,
        "rules": [RUNTIME_RULE, our_rule()],
    }
    job_spec = spec["replicatedJobs"][0]["template"]["spec"]
    assert job_spec["backoffLimit"] == 0
    assert job_spec["podFailurePolicy"]["rules"] == [
        TEMPFAIL_RULE,
        ignore_disruptions_rule(),
        non_retriable_rule([137, 143], "FailJob", "node"),
    ]
    assert job_spec["template"]["metadata"]["annotations"] == {
        P + "backoff-limit": "3",
        P + "non-spot-attempts": "1",
    }
    # What the webhook added belongs to no field manager: the trainer's Apply entry owns
    # the rule lists (atomic) but not maxRestarts, the child budget or the annotations.
    fields = stored["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]
    assert fields["f:failurePolicy"] == {"f:rules": {}}
    node = fields["f:replicatedJobs"]['k:{"name":"node"}']["f:template"]["f:spec"]
    assert "f:backoffLimit" not in node and node["f:podFailurePolicy"] == {"f:rules": {}}


@pytest.mark.parametrize("order", ["jobset-first", "ours-first"])
def test_a_reapply_that_resets_the_rules_is_restored_exactly(order):
    """Kueue admits the suspended TrainJob: the trainer applies the JobSet again, with
    suspend false and Kueue's nodeSelector. The lists it owns whole come back as the
    runtime has them, without the webhook's rules; JobSet would refuse that (immutable).
    The mutating webhook puts them back exactly, and again on every later re-apply."""
    tj = admitted_trainjob(RULES_RUNTIME)
    stored, managed = create_jobset(tj, RULES_RUNTIME, order)
    resumed = copy.deepcopy(tj)
    resumed["spec"]["suspend"] = False
    config = trainer_jobset(resumed, RULES_RUNTIME, node_selector=KUEUE_SELECTOR)
    update, owners = reapply(stored, managed, config)
    # The UPDATE as sent: the webhook's rules are gone from both lists ...
    assert update["spec"]["failurePolicy"]["rules"] == [RUNTIME_RULE]
    child = update["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert child["podFailurePolicy"]["rules"] == [TEMPFAIL_RULE]
    # ... what belongs to no manager is still there ...
    assert update["spec"]["failurePolicy"]["maxRestarts"] == 3 and child["backoffLimit"] == 0
    # ... and JobSet would refuse the update as it stands.
    assert jobset_update_errors(update, stored)
    verdict, final = update_admission(update, stored)
    assert verdict.patch
    assert any("restored spec.failurePolicy" in w for w in verdict.warnings)
    assert jobset_update_errors(final, stored) == []
    assert final["spec"]["failurePolicy"] == stored["spec"]["failurePolicy"]
    assert final["spec"]["suspend"] is False
    pod = final["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == KUEUE_SELECTOR
    validate_schema(final)
    # The next re-apply (a reconcile of the same TrainJob) changes nothing.
    again, _ = reapply(final, owners, config)
    verdict, final_again = update_admission(again, final)
    assert final_again == final


@pytest.mark.parametrize("made", ["with", "before"])
def test_a_reapply_restores_the_count_rule_as_the_jobset_was_made(made):
    """fail-non-retriable without ignore-disruptions: the child Job's rules get the Count
    rule on DisruptionTarget before FailJob (matchPodFailurePolicy), and the trainer's
    re-apply (suspend false, Kueue's nodeSelector) resets them to the runtime's. JobSet
    refuses any change of them (ValidateUpdate), so ``restore`` gives them back exactly:
    with the Count rule, or, for a JobSet a webhook without it made (its record has no
    countDisruptions), without it: never a denial, never a rule the JobSet did not have."""
    ref = {"name": RULES_RUNTIME["metadata"]["name"]}
    obj = trainjob({P + "fail-non-retriable": "true", P + "backoff-limit": "3"}, ref=ref)
    obj["spec"]["suspend"] = True
    verdict, tj = mutate(obj, GivenRuntimes([RULES_RUNTIME]))
    assert verdict.allowed, verdict.message
    stored, managed = create_jobset(tj, RULES_RUNTIME, "jobset-first")
    child = stored["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert child["podFailurePolicy"]["rules"] == [
        TEMPFAIL_RULE,
        count_disruptions_rule(),
        non_retriable_rule([143], "FailJob", "node"),
    ]
    record = json.loads(stored["metadata"]["annotations"][P + "applied"])
    assert record["countDisruptions"] is True
    if made == "before":
        # A webhook before the Count rule wrote the version-1 record: no origins.
        del child["podFailurePolicy"]["rules"][1]
        for key in ("countDisruptions", "origins", "v"):
            del record[key]
        stored["metadata"]["annotations"][P + "applied"] = json.dumps(record, separators=(",", ":"))
        assert validate(stored).allowed  # as a new replica validates what an old one made
    resumed = copy.deepcopy(tj)
    resumed["spec"]["suspend"] = False
    config = trainer_jobset(resumed, RULES_RUNTIME, node_selector=KUEUE_SELECTOR)
    update, _ = reapply(stored, managed, config)
    assert update["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"] == {
        "rules": [TEMPFAIL_RULE]
    }
    assert jobset_update_errors(update, stored)
    verdict, final = update_admission(update, stored)
    assert any(w.startswith("retry-policy: restored spec.") for w in verdict.warnings)
    assert jobset_update_errors(final, stored) == []
    assert (
        final["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]
        == (child["podFailurePolicy"])
    )
    assert (
        final["metadata"]["annotations"][P + "applied"]
        == (stored["metadata"]["annotations"][P + "applied"])
    )
    validate_schema(final)


def test_a_reapply_that_keeps_the_policy_is_left_alone():
    """A runtime without rules of its own: the trainer owns no list the webhook added to,
    so its re-apply keeps everything and the webhook changes nothing."""
    rt = runtime()
    tj = admitted_trainjob(rt)
    stored, managed = create_jobset(tj, rt, "jobset-first")
    resumed = copy.deepcopy(tj)
    resumed["spec"]["suspend"] = False
    update, _ = reapply(stored, managed, trainer_jobset(resumed, rt, node_selector=KUEUE_SELECTOR))
    assert update["spec"]["failurePolicy"] == stored["spec"]["failurePolicy"]
    verdict, final = update_admission(update, stored)
    assert verdict.patch == [] and not verdict.warnings
    assert jobset_update_errors(final, stored) == []


def test_a_restore_never_writes_a_value_creation_did_not():
    """A guard rail lowered since the JobSet's creation: applying the policy again would
    be denied, so the update is left as it came (JobSet then refuses it, as it would
    without this webhook), with a warning; never a denial of ours."""
    tj = admitted_trainjob(RULES_RUNTIME)
    stored, managed = create_jobset(tj, RULES_RUNTIME, "jobset-first")
    resumed = copy.deepcopy(tj)
    resumed["spec"]["suspend"] = False
    update, _ = reapply(stored, managed, trainer_jobset(resumed, RULES_RUNTIME))
    rails = parse_config("guardRails: {maxBackoffLimit: 2}\n")
    verdict, final = mutate(update, config=rails, operation="UPDATE", old=stored)
    assert verdict.allowed and verdict.patch == []
    assert any("nothing was changed" in w for w in verdict.warnings)
    assert final == update


def test_a_changed_policy_is_not_restored():
    """Annotations changed by the update: what they ask applies to new objects only, and
    a restore of the old policy would hide the change; validation says so."""
    tj = admitted_trainjob(RULES_RUNTIME)
    stored, managed = create_jobset(tj, RULES_RUNTIME, "jobset-first")
    changed = copy.deepcopy(tj)
    carried(changed)[P + "backoff-limit"] = "5"
    update, _ = reapply(stored, managed, trainer_jobset(changed, RULES_RUNTIME))
    verdict, _ = mutate(update, operation="UPDATE", old=stored)
    assert verdict.patch == []
    warned = validate(update, operation="UPDATE", old=stored)
    assert warned.allowed
    assert any("apply to objects created from now on" in w for w in warned.warnings)


def test_jobset_for_builds_what_the_trainer_applies():
    """``jobset_for`` (the TrainJob's admission judges it) against the configuration
    ``JobSet.Build`` applies, in all the policy reads; the trainer's managedFields say
    the same fields were written."""
    for rt in (runtime(), RULES_RUNTIME):
        tj = admitted_trainjob(rt)
        built, applied = jobset_for(tj, rt), trainer_jobset(tj, rt)
        fields = built["metadata"].pop("managedFields")[0]["fieldsV1"]
        for part in ("name", "namespace", "annotations", "ownerReferences"):
            assert built["metadata"][part] == applied["metadata"][part]
        assert built["spec"][
            "failurePolicy" if "failurePolicy" in applied["spec"] else "suspend"
        ] == applied["spec"].get("failurePolicy", applied["spec"]["suspend"])
        for got, want in zip(
            built["spec"]["replicatedJobs"], applied["spec"]["replicatedJobs"], strict=True
        ):
            for field in ("backoffLimit", "podFailurePolicy", "podReplacementPolicy"):
                assert got["template"]["spec"].get(field) == want["template"]["spec"].get(field)
            assert got["template"]["spec"]["template"]["spec"].get("restartPolicy") == want[
                "template"
            ]["spec"]["template"]["spec"].get("restartPolicy")
        expected = ssa.fields_v1(ssa.field_set(applied))
        assert set(fields["f:spec"]) <= set(expected["f:spec"])
        assert fields["f:metadata"]["f:annotations"] == expected["f:metadata"]["f:annotations"]


# --- the TrainJob's own updates ---------------------------------------------------------


def trainer_defaults(obj: dict[str, Any], old: dict[str, Any] | None, now: str) -> None:
    """Trainer's TrainJob webhook (``TrainJobDefaulter.Default``): a patch without ``time``
    gets one; on UPDATE an entry equal to the old one but for ``time`` keeps the old time."""
    previous = {p["manager"]: p for p in (old or {}).get("spec", {}).get("runtimePatches") or []}
    for patch in obj["spec"].get("runtimePatches") or []:
        before = previous.get(patch["manager"])
        strip = lambda p: {k: v for k, v in p.items() if k != "time"}  # noqa: E731
        if before is not None and strip(before) == strip(patch):
            patch["time"] = before["time"]
        elif before is not None or "time" not in patch:
            patch["time"] = now


def merge_diff(before: Any, after: Any) -> Any:
    """RFC 7386 merge patch from ``before`` to ``after`` (lists whole, deletions null)."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return copy.deepcopy(after)
    patch = {k: None for k in before if k not in after}
    for key, value in after.items():
        if key not in before:
            patch[key] = copy.deepcopy(value)
        elif before[key] != value:
            patch[key] = merge_diff(before[key], value)
    return patch


def _only(patch: Any, nulls: bool) -> Any:
    if not isinstance(patch, dict):
        return patch
    out = {}
    for key, value in patch.items():
        if value is None:
            if nulls:
                out[key] = None
        elif isinstance(value, dict):
            kept = _only(value, nulls)
            if kept:
                out[key] = kept
        elif not nulls:
            out[key] = value
    return out


def merge_apply(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_apply(out.get(key), value)
    return out


def kubectl_apply(current: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """``kubectl apply`` (client side) of ``manifest`` over ``current``, for a custom
    resource: ``jsonmergepatch.CreateThreeWayJSONMergePatch(original, modified, current)``
    (deletions from last-applied to the manifest, additions and changes from the live
    object to the manifest), applied as a JSON merge patch: a list is replaced whole."""
    original = json.loads(current["metadata"]["annotations"][LAST_APPLIED])
    modified = copy.deepcopy(manifest)
    modified.setdefault("metadata", {}).setdefault("annotations", {})[LAST_APPLIED] = json.dumps(
        manifest
    )
    deletions = _only(merge_diff(original, modified), nulls=True)
    changes = _only(merge_diff(current, modified), nulls=False)
    return merge_apply(current, merge_apply(deletions, changes))


def test_a_kubectl_reapply_of_a_trainjob_keeps_the_webhooks_patch():
    """The user's manifest has runtime patches of its own: ``kubectl apply`` of the same
    manifest again replaces the whole list, dropping the webhook's entry (and Trainer's
    ``time``s). Trainer refuses a changed runtimePatches while the TrainJob runs; the
    webhook puts its entry back as it was, at its place, so the update goes through."""
    team = {
        "manager": "example.com/team",
        "trainingRuntimeSpec": {"template": {"metadata": {"labels": {"team": "a"}}}},
    }
    tj = trainjob(FULL, patches=[team], suspend=False)
    manifest = json.loads(tj["metadata"]["annotations"][LAST_APPLIED])
    _, stored = mutate(tj, GivenRuntimes([runtime()]))
    trainer_defaults(stored, None, "2026-11-25T00:00:00Z")
    assert [p["manager"] for p in stored["spec"]["runtimePatches"]] == ["example.com/team", MANAGER]
    update = kubectl_apply(stored, manifest)
    assert update["spec"]["runtimePatches"] == [team]  # the API server's merge, as sent
    trainer_defaults(update, stored, "2026-11-25T01:00:00Z")
    verdict, final = mutate(update, GivenRuntimes([runtime()]), operation="UPDATE", old=stored)
    assert verdict.allowed and verdict.patch
    assert any("kept retry-policy.dev/webhook as it was" in w for w in verdict.warnings)
    # ``checkRuntimePatchesImmutability``: not suspended, so the list must be unchanged.
    assert final["spec"]["runtimePatches"] == stored["spec"]["runtimePatches"]
    assert validate(final, GivenRuntimes([runtime()]), operation="UPDATE", old=stored).allowed
    validate_schema(final)
    # The same update once the entry is back (reinvocation): nothing more to do.
    again, twice = mutate(final, GivenRuntimes([runtime()]), operation="UPDATE", old=stored)
    assert again.patch == [] and twice == final


def test_a_server_side_reapply_of_a_trainjob_keeps_the_patch():
    """``kubectl apply --server-side``: runtimePatches is a map list keyed by manager, and
    the webhook's entry belongs to no manager: the user's apply leaves it alone."""
    tj = trainjob(FULL, applied=False, suspend=False)
    manifest = {k: copy.deepcopy(tj[k]) for k in ("apiVersion", "kind")}
    manifest["metadata"] = {
        "name": tj["metadata"]["name"],
        "namespace": "ml",
        "annotations": dict(FULL),
    }
    manifest["spec"] = {"runtimeRef": {"name": "torch-distributed"}}
    managed = {"kubectl": ssa.field_set(manifest)}
    _, stored = mutate(tj, GivenRuntimes([runtime()]))
    update, _ = ssa.apply(stored, managed, manifest, "kubectl")
    assert update["spec"]["runtimePatches"] == stored["spec"]["runtimePatches"]
    verdict, _ = mutate(update, GivenRuntimes([runtime()]), operation="UPDATE", old=stored)
    assert verdict.patch == []


def _lists(schema: Any, name: str = ""):
    """(field name, list schema) of every list in a CRD schema."""
    if not isinstance(schema, dict):
        return
    if schema.get("type") == "array":
        yield name, schema
        yield from _lists(schema.get("items"), "")
    for key, sub in (schema.get("properties") or {}).items():
        yield from _lists(sub, key)


def test_list_keys_are_the_crds():
    """The map lists ``jobset_for`` and the server-side apply model key by item: every
    ``x-kubernetes-list-type: map`` list of the vendored CRDs is one, with its keys, and
    none of them is atomic there."""
    seen = set()
    for kind in ("JobSet", "TrainJob", "TrainingRuntime"):
        group = "trainer.kubeflow.org" if kind != "JobSet" else "jobset.x-k8s.io"
        schema = crd_schema({"apiVersion": f"{group}/v1", "kind": kind})
        for name, sub in _lists(schema):
            if sub.get("x-kubernetes-list-type") == "map":
                assert LIST_KEYS.get(name) == tuple(sub["x-kubernetes-list-map-keys"]), name
                seen.add(name)
            elif name in LIST_KEYS:
                raise AssertionError(f"{name} is not a map list in the {kind} CRD")
    assert {"replicatedJobs", "runtimePatches"} <= seen


def test_explain_without_the_runtime_says_what_it_needs(tmp_path):
    """``explain`` of a TrainJob alone: its settings and where they go; the budget and
    rules need the runtime, which the note asks for; the upstream trap is stated."""
    import io

    from webhook import cli

    path = tmp_path / "trainjob.yaml"
    manifest = json.loads(trainjob(FULL)["metadata"]["annotations"][LAST_APPLIED])
    path.write_text(json.dumps(manifest))
    out, err = io.StringIO(), io.StringIO()
    args = cli.build_parser().parse_args(["explain", "-f", str(path)])
    assert args.func(args, out, err) == 0, err.getvalue()
    text = " ".join(out.getvalue().split())
    assert "backoff-limit 3 your annotation" in text
    assert "The trainer makes a JobSet from ClusterTrainingRuntime torch-distributed" in text
    assert "is not in the input (give it in the same file" in text
    assert "kubeflow/trainer#3779" in text


# --- Kubeflow Trainer's shipped runtimes, as v2.2 and v2.3 build their JobSets -------------

RELEASES = ("v2.2.0", "v2.3.0")
INITIALIZERS = ("dataset-initializer", "model-initializer")
#: The JobSet release each Trainer release requires (``sigs.k8s.io/jobset`` in go.mod).
JOBSET_OF = {"v2.2.0": "v0.11.1", "v2.3.0": "v0.12.0"}
JOBSET_SCHEMAS = ROOT / "tests" / "data" / "crds" / "jobset-releases"


def jobset_schema(release: str) -> dict[str, Any]:
    """The JobSet CRD schema of the JobSet release Trainer ``release`` builds against."""
    name = f"jobsets.jobset.x-k8s.io.{JOBSET_OF[release]}.yaml"
    return yaml.safe_load((JOBSET_SCHEMAS / name).read_text())


SHIPPED = sorted(
    (release, path.stem) for release in RELEASES for path in (RUNTIMES / release).glob("*.yaml")
)


def as_stored(tj: dict[str, Any]) -> dict[str, Any]:
    """The TrainJob the trainer reconciles (the API server gave it its uid)."""
    obj = copy.deepcopy(tj)
    obj["metadata"]["uid"] = str(uuid.uuid4())
    return obj


def without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
    return {**obj, "metadata": meta}


def step_of(rjob: dict[str, Any]) -> str | None:
    return rjob["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR_LABEL)


def node_resources_of(jobset: dict[str, Any], rjob_name: str) -> dict[str, Any] | None:
    (rjob,) = [r for r in jobset["spec"]["replicatedJobs"] if r["name"] == rjob_name]
    (node,) = [c for c in rjob["template"]["spec"]["template"]["spec"]["containers"]]
    return node.get("resources")


@pytest.mark.parametrize(("release", "name"), SHIPPED, ids=["/".join(s) for s in SHIPPED])
def test_shipped_runtimes_make_jobsets_their_admission_accepts(release, name, tmp_path):
    """Every runtime Trainer v2.2.0 and v2.3.0 install, named by a TrainJob annotated like
    examples/job.yaml: admitted; the JobSet the trainer builds from it (``jobset_for``)
    matches JobSet's CRD schema and the strict Kubernetes 1.35 to 1.37 schemas, is
    admitted, and its patch (applied with Go's json-patch) holds the policy on the
    trainer's Jobs only: an initializer keeps its own retries (no podFailurePolicy, no
    backoffLimit 0, its restartPolicy), and our JobSet rule then names the Jobs our rules
    are in; a second run changes nothing."""
    rt = shipped(release, name)
    schema = jobset_schema(release)
    template = {"apiVersion": JOBSET, "kind": "JobSet", "metadata": {}}
    validate_schema({**template, "spec": rt["spec"]["template"]["spec"]}, schema=schema)
    tj = submitted(FULL, rt, numNodes=2)
    verdict, out = mutate(tj, GivenRuntimes([rt], trainer=release))
    assert verdict.allowed, verdict.message
    steps = {r["name"]: step_of(r) for r in rt["spec"]["template"]["spec"]["replicatedJobs"]}
    left_out = [n for n, step in steps.items() if step in INITIALIZERS]
    if left_out:
        assert (
            f"retry-policy: initializers {', '.join(left_out)} keep their own retries; the "
            "policy is the trainer's"
        ) in verdict.warnings
    (merged,) = resource_modes(release)
    built = jobset_for(as_stored(out), rt, merged)
    for version in ("1.35", "1.36", "1.37"):
        validate_schema(built, version, schema)
    admitted_js, jobset = mutate(built)
    assert admitted_js.allowed, admitted_js.message
    # (kubectl prints no managedFields: compared without them.)
    assert kubectl_patch(built, admitted_js.patch, tmp_path) == without_managed_fields(jobset)
    for version in ("1.35", "1.36", "1.37"):
        validate_schema(jobset, version, schema)
    for rjob in jobset["spec"]["replicatedJobs"]:
        spec = rjob["template"]["spec"]
        pod = spec["template"]["spec"]
        if rjob["name"] in left_out:
            assert "podFailurePolicy" not in spec and "backoffLimit" not in spec
            assert pod.get("restartPolicy") is None  # JobSet's webhook makes it OnFailure
            assert P + "backoff-limit" not in spec["template"].get("metadata", {}).get(
                "annotations", {}
            )
        else:
            assert spec["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
            assert spec["podFailurePolicy"]["rules"][-1]["action"] == "FailJob"
    targets = [n for n in steps if n not in left_out] if left_out else []
    assert jobset["spec"]["failurePolicy"]["rules"] == [our_rule(targets)]
    again, twice = mutate(jobset)
    assert again.allowed and again.patch == [] and twice == jobset


def test_a_trainjob_counts_the_pods_the_trainer_runs():
    """``JobSet.Build`` (v2.2; ``SyncParallelCount`` in v2.3) sets every replicated Job's
    parallelism and completions to its pod count: the TrainJob's numNodes for the trainer
    step (torch, jax: ``EnforceMLPolicy``), under MPI for the ``node`` Job, less the
    launcher with runLauncherAsNode (``MPI.EnforceMLPolicy``); 1 for the rest; one replica
    of the trainer's and the initializers' Jobs (``Builder.Trainer``, ``Initializer``)."""
    for release in RELEASES:
        cases = {
            "torch_distributed": {"node": (4, 1)},
            "jax_distributed": {"node": (4, 1)},
            "deepspeed_distributed": {"node": (3, None), "launcher": (1, 1)},
            "llama3_2_1B": {"dataset-initializer": (1, 1), "model-initializer": (1, 1)},
        }
        for name, want in cases.items():
            rt = shipped(release, name)
            built = jobset_for(as_stored(submitted(FULL, rt, numNodes=4)), rt)
            jobs = {r["name"]: r for r in built["spec"]["replicatedJobs"]}
            for job_name, (pods, replicas) in want.items():
                spec = jobs[job_name]["template"]["spec"]
                assert (spec["parallelism"], spec["completions"]) == (pods, pods), name
                assert jobs[job_name].get("replicas") == replicas, (name, job_name)


@pytest.mark.parametrize("release", RELEASES)
def test_resources_per_node_as_each_release_applies_it(release):
    """``spec.trainer.resourcesPerNode`` on the ``node`` container: v2.2 gives it exactly
    the limits and requests given (``Builder.Trainer`` in pkg/runtime/framework/plugins/
    jobset/builder.go: ``WithResources``), v2.3 merges them into the runtime's per
    resource (``newRuntimeInfo`` in pkg/runtime/core/trainingruntime.go with
    ``MergeResourceRequirements``, a strategic merge patch). The trainer step's Job gets
    it, and under MPI with runLauncherAsNode the ``node`` Job too."""
    merged = release == "v2.3.0"
    per_node = {"limits": {"memory": "16Gi"}, "requests": {"memory": "8Gi"}}
    tune = shipped(release, "llama3_2_1B")  # its node container: limits nvidia.com/gpu 2
    built = jobset_for(as_stored(submitted(FULL, tune, resourcesPerNode=per_node)), tune, merged)
    want = copy.deepcopy(per_node)
    if merged:
        want["limits"] = {"nvidia.com/gpu": 2, "memory": "16Gi"}
    assert node_resources_of(built, "node") == want
    assert node_resources_of(built, "dataset-initializer") is None  # not a node
    mpi = shipped(release, "deepspeed_distributed")  # runLauncherAsNode: true
    built = jobset_for(as_stored(submitted(FULL, mpi, resourcesPerNode=GPU)), mpi, merged)
    assert node_resources_of(built, "launcher") == GPU
    assert node_resources_of(built, "node") == GPU


@pytest.mark.parametrize(
    ("release", "memory", "per_node", "node", "allowed"),
    [
        # GPUs only: v2.2 drops the runtime's 32Gi, v2.3 keeps it (above 16Gi).
        ("v2.2.0", True, GPU, GPU, True),
        (
            "v2.3.0",
            True,
            GPU,
            {**GPU, "requests": {"memory": "32Gi"}}
            | {"limits": {"memory": "32Gi", "nvidia.com/gpu": 1}},
            False,
        ),
        # A memory limit alone: v2.2's is also the pods' request (8Gi), v2.3 keeps 32Gi.
        ("v2.2.0", True, {"limits": {"memory": "8Gi"}}, {"limits": {"memory": "8Gi"}}, True),
        (
            "v2.3.0",
            True,
            {"limits": {"memory": "8Gi"}},
            {"limits": {"memory": "8Gi"}, "requests": {"memory": "32Gi"}},
            False,
        ),
        # 64Gi asked of a runtime without memory: above 16Gi in both releases.
        (
            "v2.2.0",
            False,
            {"requests": {"memory": "64Gi"}},
            {"requests": {"memory": "64Gi"}},
            False,
        ),
        (
            "v2.3.0",
            False,
            {"requests": {"memory": "64Gi"}},
            {"requests": {"memory": "64Gi"}},
            False,
        ),
    ],
    ids=["v2.2-gpu", "v2.3-gpu", "v2.2-limit", "v2.3-limit", "v2.2-64Gi", "v2.3-64Gi"],
)
def test_memory_checks_agree_with_the_jobset_the_trainer_makes(
    release, memory, per_node, node, allowed
):
    """oom-memory-limit must not be below a container's memory request (``check_memory``):
    judged on the node container as the release gives it resourcesPerNode, so the
    TrainJob's admission says what the JobSet's will, both ways (it ignored
    resourcesPerNode before: the first case was denied, the last two admitted). The
    JobSet as the trainer applies it is written out here (``node``), not taken from
    ``jobset_for``."""
    rt = memory_runtime(release) if memory else shipped(release, "torch_distributed")
    tj = submitted(OOM, rt, resourcesPerNode=per_node)
    verdict, _ = mutate(tj, GivenRuntimes([rt], trainer=release))
    assert verdict.allowed is allowed, verdict.message
    # The JobSet the trainer would make (of a TrainJob carrying the policy anyway: its
    # runtime patch as the webhook writes it).
    carrying = copy.deepcopy(tj)
    carrying["spec"]["runtimePatches"] = [our_patch(tj, Context(Config()))]
    applied = jobset_for(as_stored(carrying), rt, release == "v2.3.0")
    assert node_resources_of(applied, "node") == node
    by_jobset, _ = mutate(applied)
    assert by_jobset.allowed is allowed
    if not allowed:
        assert "annotation retry-policy.dev/oom-memory-limit: 16Gi is below the memory " in (
            verdict.message
        )
        assert "spec.trainer.resourcesPerNode" in verdict.message
        assert "ClusterTrainingRuntime torch-distributed: spec.template.spec.replicatedJobs[0]" in (
            verdict.message
        )


def test_without_the_release_what_one_denies_is_a_warning():
    """The Trainer's release not known (no kubeflow-trainer-public ConfigMap): both
    JobSets are judged; what both deny is denied, what only one denies is said."""
    rt = memory_runtime("v2.3.0")
    verdict, _ = mutate(submitted(OOM, rt, resourcesPerNode=GPU), GivenRuntimes([rt]))
    assert verdict.allowed, verdict.message
    (said,) = [w for w in verdict.warnings if "release is not known" in w]
    assert said.startswith(
        "retry-policy: Trainer's release is not known; under v2.3 (resourcesPerNode merged) "
        "the JobSet would be denied: annotation retry-policy.dev/oom-memory-limit: 16Gi is "
        "below the memory request of container node (32Gi)"
    )
    both = submitted(OOM, rt, resourcesPerNode={"requests": {"memory": "64Gi"}})
    verdict, _ = mutate(both, GivenRuntimes([rt]))
    assert not verdict.allowed and "(64Gi)" in verdict.message


def test_the_release_comes_from_trainers_configmap_in_the_cli_input(tmp_path):
    """``retry-webhook dry-run`` of a file with the runtime, Trainer's public ConfigMap
    (``kubectl get configmap -n kubeflow-system kubeflow-trainer-public -o yaml``) and the
    TrainJob judges the TrainJob as that release builds its JobSet."""
    import io

    from webhook import cli

    rt = memory_runtime("v2.3.0")
    manifest = json.loads(submitted(OOM, rt)["metadata"]["annotations"][LAST_APPLIED])
    manifest["spec"]["trainer"]["resourcesPerNode"] = GPU
    for release, code in (("v2.2.0", 0), ("v2.3.0", 1)):
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kubeflow-trainer-public", "namespace": "kubeflow-system"},
            "data": {"kubeflow_trainer_version": release},
        }
        path = tmp_path / f"{release}.yaml"
        path.write_text(yaml.safe_dump_all([configmap, rt, manifest]))
        out, err = io.StringIO(), io.StringIO()
        args = cli.build_parser().parse_args(["dry-run", "-f", str(path)])
        assert args.func(args, out, err) == code, err.getvalue()
        assert ("16Gi is below the memory request" in err.getvalue()) is (code == 1)


@pytest.mark.parametrize(("release", "warned"), [(None, True), ("v2.3.0", True), ("v2.4.0", False)])
def test_a_runtime_deleting_finished_jobsets_is_warned(release, warned):
    """Up to v2.3.0 the trainer clears a TrainJob's Failed condition before it checks
    whether the TrainJob is finished (``Reconcile`` in pkg/controller/trainjob_controller.go),
    so a failed TrainJob whose JobSet the runtime's ttlSecondsAfterFinished deleted gets a
    new JobSet: its budget starts over (kubeflow/trainer#3779; fixed on master by #3891,
    after v2.3.0)."""
    rt = runtime(ttlSecondsAfterFinished=600)
    verdict, _ = mutate(trainjob(FULL), GivenRuntimes([rt], trainer=release))
    assert verdict.allowed, verdict.message
    assert (TTL_NOTE in verdict.warnings) is warned
    assert len(TTL_NOTE) <= 120
    verdict, _ = mutate(trainjob(FULL), GivenRuntimes([runtime()], trainer=release))
    assert not any("ttlSecondsAfterFinished" in w for w in verdict.warnings)


#: A runtime with an initializer before a trainer step whose lists the webhook adds to.
INIT_RUNTIME = copy.deepcopy(RULES_RUNTIME)
INIT_RUNTIME["metadata"]["name"] = "torch-init"
INIT_RUNTIME["spec"]["template"]["spec"]["replicatedJobs"].insert(
    0,
    {
        "name": "dataset-initializer",
        "template": {
            "metadata": {"labels": {ANCESTOR_LABEL: "dataset-initializer"}},
            "spec": {
                "template": {
                    "spec": {"containers": [{"name": "dataset-initializer", "image": "init:1"}]}
                }
            },
        },
    },
)


@pytest.mark.parametrize("made", ["now", "before"])
def test_a_reapply_keeps_the_initializers_as_the_jobset_was_made(made, monkeypatch):
    """A JobSet made before the initializers were left out of the policy has our rules in
    its initializer's Job too; JobSet keeps them immutable (``ValidateUpdate``). The
    trainer's re-apply (Kueue's resume) resets the rule lists it owns; ``restore`` gives
    them back as they were made, either way: never a denial of the trainer's apply."""
    from webhook.kinds.jobset.mutate import JobSetMutator

    tj = admitted_trainjob(INIT_RUNTIME)
    if made == "before":
        monkeypatch.setattr(JobSetMutator, "scope_initializers", False)
    stored, managed = create_jobset(tj, INIT_RUNTIME, "jobset-first")
    monkeypatch.undo()
    init = stored["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert ("podFailurePolicy" in init) is (made == "before")
    resumed = copy.deepcopy(tj)
    resumed["spec"]["suspend"] = False
    config = trainer_jobset(resumed, INIT_RUNTIME, node_selector=KUEUE_SELECTOR)
    update, _ = reapply(stored, managed, config)
    assert jobset_update_errors(update, stored)
    verdict, final = update_admission(update, stored)
    assert any(w.startswith("retry-policy: restored spec.") for w in verdict.warnings)
    assert jobset_update_errors(final, stored) == []
    validate_schema(final)


def test_explain_lists_no_deadline_hint_as_a_change(tmp_path):
    """``explain`` of a TrainJob ignoring disruptions without a deadline: the hint to set
    spec.activeDeadlineSeconds is a note of the TrainJob, not a change, and its JobSet
    shows no hint of its own (the TrainJob's deadline is the one that counts)."""
    import io

    from webhook import cli

    manifest = json.loads(trainjob(FULL)["metadata"]["annotations"][LAST_APPLIED])
    path = tmp_path / "trainjob.yaml"
    path.write_text(yaml.safe_dump_all([runtime(), manifest]))
    out, err = io.StringIO(), io.StringIO()
    args = cli.build_parser().parse_args(["explain", "-f", str(path), "-o", "json"])
    assert args.func(args, out, err) == 0, err.getvalue()
    trainjob_part, jobset_part, *_ = json.loads(out.getvalue())["items"]
    hint = "set spec.activeDeadlineSeconds: ignored disruptions retry with no cap"
    assert hint in trainjob_part["notes"]
    assert not any("activeDeadlineSeconds" in c for c in trainjob_part["changes"])
    assert not any("activeDeadlineSeconds" in c for c in jobset_part["changes"])
    assert any("maxRestarts -> 3" in c for c in jobset_part["changes"])


def test_simulate_fails_an_initializers_container(tmp_path):
    """``--simulate dataset-initializer:1`` walks the failure through the Job of the
    initializer (its own retries: the pod restarts in place, OnFailure), not the
    trainer's; an unknown container is still an error."""
    import io

    from webhook import cli

    rt = shipped("v2.3.0", "llama3_2_1B")
    manifest = json.loads(submitted(FULL, rt)["metadata"]["annotations"][LAST_APPLIED])
    path = tmp_path / "trainjob.yaml"
    path.write_text(yaml.safe_dump_all([rt, manifest]))
    out, err = io.StringIO(), io.StringIO()
    args = cli.build_parser().parse_args(
        ["explain", "-f", str(path), "--simulate", "dataset-initializer:1", "-o", "json"]
    )
    assert args.func(args, out, err) == 0, err.getvalue()
    parts = {item.get("part", ""): item for item in json.loads(out.getvalue())["items"]}
    walked = parts["replicatedJob dataset-initializer"]["simulation"]
    assert "restarts in place" in json.dumps(walked)
    assert parts["replicatedJob node"].get("simulation") is None
    assert (
        "Kubernetes' default: a TrainJob's initializers keep their own retries"
        in (parts["replicatedJob dataset-initializer"]["budget"])
    )
    args = cli.build_parser().parse_args(["explain", "-f", str(path), "--simulate", "ghost:1"])
    assert args.func(args, io.StringIO(), err) == 2
    assert "names container 'ghost', which no pod of JobSet/llm-finetune has" in err.getvalue()


def test_the_cli_says_what_the_server_says_of_a_shipped_runtime(tmp_path):
    """``retry-webhook dry-run`` of a shipped torchtune runtime given a TTL, and a TrainJob
    on 4 nodes: the initializers left out, the TTL and the pods that run together are
    warned about, as on the server (tests/kinds/trainjob/test_runtimes.py)."""
    import io

    from webhook import cli
    from webhook.kinds.workload import peers_note

    rt = shipped("v2.3.0", "llama3_2_1B")
    rt["spec"]["template"]["spec"]["ttlSecondsAfterFinished"] = 3600
    manifest = json.loads(submitted(FULL, rt)["metadata"]["annotations"][LAST_APPLIED])
    path = tmp_path / "trainjob.yaml"
    path.write_text(yaml.safe_dump_all([rt, manifest]))
    out, err = io.StringIO(), io.StringIO()
    args = cli.build_parser().parse_args(["dry-run", "-f", str(path)])
    assert args.func(args, out, err) == 0, err.getvalue()
    warnings = err.getvalue().splitlines()
    assert (
        "Warning: retry-policy: initializers dataset-initializer, model-initializer keep their "
        "own retries; the policy is the trainer's"
    ) in warnings
    assert f"Warning: {TTL_NOTE}" in warnings
    assert f"Warning: {peers_note(4)}" in warnings


def test_a_trainjob_declares_what_it_changes_about_the_jobset_it_makes():
    """Loaded with the kinds' list, the TrainJob tells the JobSet's folder what owning a
    JobSet changes there (``jobset.mutate.Owner``): that folder names no TrainJob."""
    assert registry.KINDS and jobset_mutate.OWNERS[KIND] is JOBSET_OWNER
    assert JOBSET_OWNER.own_steps == INITIALIZER_STEPS and JOBSET_OWNER.audited_with_it
