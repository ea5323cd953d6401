"""``retry-delay`` where placement and the gate meet: a pod that names its node (the API
server refuses it gated), and JobSet's exclusive placement (its pod webhooks refuse a
follower until its leader is scheduled)."""

from __future__ import annotations

import copy

import pytest

from testkit.builders import P, job, pod, review
from testkit.delays import DELAY, NOW, Source, admit, fixed_time, job_pod  # noqa: F401
from testkit.kinds import cronjob, jobset, replicated
from testkit.servers import start, stop
from testkit.workloads import mutate, validate
from webhook.kube import gates, jobsetplacement
from webhook.plan import delays as between
from webhook.policy.config import parse_config
from webhook.policy.grammar import format_time

PINNED = {"nodeName": "gpu-node-7"}


def refused_on_create(made: dict) -> list[str]:
    """What the API server refuses of a pod as created, of the rule the gate meets.
    upstream: ValidatePodCreate (pkg/apis/core/validation/validation.go): "A Pod cannot be
    assigned a Node if there are remaining scheduling gates"."""
    spec = made["spec"]
    if spec.get("nodeName") and spec.get("schedulingGates"):
        return [
            "spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared"
        ]
    return []


def pinned_job(annotations: dict | None = None) -> dict:
    made = job(annotations)
    made["spec"]["template"]["spec"].update(PINNED)
    return made


# --- nodeName --------------------------------------------------------------------------------


def test_a_gated_pinned_pod_is_what_the_api_server_refuses():
    """Why the rule exists: the gate the webhook adds would make the pod uncreatable."""
    made = pod({}, spec=PINNED)
    gates.add_gate(made, "2026-11-26T10:00:30Z")
    assert refused_on_create(made)


def test_retry_delay_on_a_pinned_template_is_denied_naming_value_and_alternative():
    verdict = validate(pinned_job(DELAY))
    assert not verdict.allowed
    assert (
        "annotation retry-policy.dev/retry-delay: 30s cannot hold back a pod that names its "
        "node: spec.template.spec.nodeName is 'gpu-node-7', and the API server refuses a pod "
        "with both nodeName and a scheduling gate (nodeName: cannot be set until all "
        "schedulingGates have been cleared), so no delayed retry could be created; accepted: "
        "no retry-delay here, or node affinity (a nodeSelector) on kubernetes.io/hostname in "
        "place of spec.template.spec.nodeName"
    ) in verdict.message
    # attempt-env alone needs no gate: a pinned template keeps it.
    verdict, out = mutate(pinned_job({P + "attempt-env": "true"}))
    assert verdict.allowed, verdict.message
    assert out["spec"]["template"]["metadata"]["annotations"][P + "attempt-env"] == "true"


def test_a_default_retry_delay_is_skipped_on_a_pinned_template():
    config = parse_config("defaults: {retry-delay: 30s}")
    verdict, out = mutate(pinned_job(), config)
    assert verdict.allowed, verdict.message
    assert any(
        w.startswith("retry-policy: retry-delay (cluster default) skipped: 30s cannot hold back")
        for w in verdict.warnings
    )
    template = out["spec"]["template"].get("metadata", {}).get("annotations", {})
    assert P + "retry-delay" not in template


def test_cronjob_and_jobset_templates_are_judged_where_the_node_is_named():
    cron = cronjob(DELAY, job_spec={})
    cron["spec"]["jobTemplate"]["spec"]["template"]["spec"].update(PINNED)
    verdict = validate(cron)
    assert "spec.jobTemplate.spec.template.spec.nodeName is 'gpu-node-7'" in verdict.message
    workers = replicated("workers")
    workers["template"]["spec"]["template"]["spec"].update(PINNED)
    verdict = validate(jobset(DELAY, jobs=[replicated("driver"), workers]))
    assert not verdict.allowed
    assert "spec.replicatedJobs[1].template.spec.template.spec.nodeName is 'gpu-node-7'" in (
        verdict.message
    )


def test_a_controllers_pinned_pod_is_never_gated_but_told_its_attempt():
    """A Job admitted before this rule (or made elsewhere) may still carry retry-delay on a
    pinned template: its pod runs at once rather than never."""
    source = Source(failures=1)
    made = job_pod()
    made["spec"].update(PINNED)
    source.fail(made, NOW - 5)
    verdict, out = admit(made, source)
    assert verdict.allowed, verdict.message
    assert "schedulingGates" not in out["spec"] and not refused_on_create(out)
    assert (
        "retry-policy: attempt 2 of 7 not held back for its retry-delay: spec.nodeName is "
        "'gpu-node-7', and the API server refuses a gated pod with a node"
    ) in verdict.warnings
    assert between.env_in(out["spec"]["containers"][0])[between.ATTEMPT] == "1"
    assert verdict.decisions == ()


def test_a_bare_pinned_pod_is_denied():
    made = pod({**DELAY, P + "attempt": "1"}, name="step-2", spec=PINNED)
    verdict, _ = admit(made)
    assert not verdict.allowed
    assert (
        "annotation retry-policy.dev/retry-delay: 30s cannot hold back a pod that names its "
        "node: spec.nodeName is 'gpu-node-7'"
    ) in verdict.message


def test_the_real_server_denies_a_pinned_template_with_the_reason(tmp_path):
    server = start(tmp_path / "certs")
    try:
        response = server.review("/validate", review(pinned_job(DELAY)))["response"]
        assert not response["allowed"]
        assert "spec.template.spec.nodeName is 'gpu-node-7'" in response["status"]["message"]
        assert "accepted: no retry-delay here" in response["status"]["message"]
    finally:
        stop(server)


# --- JobSet exclusive placement --------------------------------------------------------------

EXCLUSIVE = {jobsetplacement.EXCLUSIVE: "cloud.google.com/gke-nodepool"}


def jobset_pod(index: str, *, placement: dict | None = None, **meta) -> dict:
    """A pod of child Job ``pretrain-workers-0`` as JobSet's controller makes it: the
    JobSet's labels and annotations (``labelAndAnnotateObject`` in
    pkg/controllers/jobset_controller.go), its completion index, restart attempt 1."""
    labels = {
        "jobset.sigs.k8s.io/jobset-name": "pretrain",
        "jobset.sigs.k8s.io/jobset-uid": "set-1",
        "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        "jobset.sigs.k8s.io/job-index": "0",
        "jobset.sigs.k8s.io/restart-attempt": "1",
    }
    annotations = {
        jobsetplacement.JOBSET_NAME: "pretrain",
        jobsetplacement.COMPLETION_INDEX: index,
        **(EXCLUSIVE if placement is None else placement),
    }
    return job_pod(
        {P + "backoff-limit": "3"},
        uid="child-1",
        labels=labels,
        annotations=annotations,
        **meta,
    )


def test_which_pods_follow_a_leader():
    # upstream: ValidateCreate (pkg/webhooks/pod_webhook.go) refuses a follower until its
    # leader is scheduled; IsLeaderPod (pkg/util/placement/placement.go): completion
    # index "0"; the node-selector strategy and pods outside a JobSet are left alone.
    assert jobsetplacement.follower(jobset_pod("1"))
    assert not jobsetplacement.follower(jobset_pod("0"))
    strategy = {**EXCLUSIVE, jobsetplacement.NODE_SELECTOR_STRATEGY: "true"}
    assert not jobsetplacement.follower(jobset_pod("1", placement=strategy))
    assert not jobsetplacement.follower(jobset_pod("1", placement={}))
    alone = jobset_pod("1")
    del alone["metadata"]["annotations"][jobsetplacement.JOBSET_NAME]
    assert not jobsetplacement.follower(alone)


def test_a_follower_is_not_held_back_a_second_time_from_its_own_admission():
    """Its failure history unknown, a follower's delay would count from its admission,
    which comes after the leader was let go and scheduled: no gate."""
    source = Source(failures=0)  # (a JobSet pod's attempt is its restart-attempt label)
    verdict, out = admit(jobset_pod("1"), source)
    assert verdict.allowed, verdict.message
    assert "schedulingGates" not in out["spec"]
    assert (
        "retry-policy: attempt 2 of 4 not held back for its retry-delay: its controller "
        "created this follower only once its leader was scheduled, past the leader's own "
        "delay (exclusive placement)"
    ) in verdict.warnings
    # The leader, in the same position, is held back from its admission.
    verdict, out = admit(jobset_pod("0"), source)
    assert gates.not_before(out) == format_time(NOW + 30)


def test_a_follower_whose_delay_counts_from_the_failure_waits_out_the_rest():
    """A follower replaced alone (its leader running) waits what is left of its delay:
    that gate JobSet's webhook does not stand in the way of."""
    source = Source(failures=0)
    failed = jobset_pod("1")
    source.fail(failed, NOW - 10, uid="child-1")
    verdict, out = admit(jobset_pod("1"), source)
    assert verdict.allowed, verdict.message
    assert gates.not_before(out) == format_time(NOW - 10 + 30)


def test_a_jobset_with_exclusive_placement_is_told_what_a_gated_leader_does():
    verdict, _ = mutate(jobset(DELAY))
    assert not any("placed exclusively" in w for w in verdict.warnings)
    obj = jobset(DELAY)
    obj["metadata"]["annotations"].update(EXCLUSIVE)
    verdict, _ = mutate(obj)
    assert verdict.allowed, verdict.message
    expected = (
        "retry-policy: replicated Job {} is placed exclusively per cloud.google.com/gke-nodepool "
        "(alpha.jobset.sigs.k8s.io/exclusive-topology): JobSet creates a Job's other pods only "
        "once its leader (index 0) is scheduled, so while retry-delay holds a leader back they "
        "are refused (FailedCreate, tried again up to a minute apart) and start after it"
    )
    assert [w for w in verdict.warnings if "placed exclusively" in w] == [
        expected.format("leader"),
        expected.format("workers"),
    ]
    # The node-selector strategy places by labels made beforehand: no leader first.
    strategy = copy.deepcopy(obj)
    strategy["metadata"]["annotations"][jobsetplacement.NODE_SELECTOR_STRATEGY] = "true"
    assert not any("placed exclusively" in w for w in mutate(strategy)[0].warnings)
    # Per replicated Job, as the template's annotation says.
    workers = replicated("workers")
    workers["template"]["metadata"] = {"annotations": dict(EXCLUSIVE)}
    verdict, _ = mutate(jobset(DELAY, jobs=[replicated("driver"), workers]))
    assert [w for w in verdict.warnings if "placed exclusively" in w] == [
        expected.format("workers")
    ]


@pytest.mark.parametrize("annotations", [{}, {P + "attempt-env": "true"}])
def test_no_retry_delay_no_placement_note(annotations):
    obj = jobset(annotations or None)
    obj["metadata"].setdefault("annotations", {}).update(EXCLUSIVE)
    verdict, _ = mutate(obj)
    assert not any("placed exclusively" in w for w in verdict.warnings)


def test_a_trainjob_whose_runtime_pins_the_node_is_denied_on_apply():
    """The runtime's pod template names its node: the JobSet the trainer makes from it
    is judged at the TrainJob's admission, where the user can still act."""
    from testkit.trainer import runtime, trainjob
    from testkit.trainer import validate as validate_trainjob
    from webhook.kinds.trainjob.runtimes import GivenRuntimes

    pinned = runtime(pod_spec=PINNED)
    verdict = validate_trainjob(trainjob(DELAY), GivenRuntimes([pinned]))
    assert not verdict.allowed
    assert "nodeName is 'gpu-node-7'" in verdict.message
    assert "annotation retry-policy.dev/retry-delay: 30s cannot hold back" in verdict.message
