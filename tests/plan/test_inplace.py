"""In-place retries (issue 27): in-place-exit-codes and in-place-scope.

Through the engine (mutate, then validate the result): what is written into each kind's
pod templates, what is denied and why, and how the rest of the policy treats in-place
codes. tests/plan/test_inplace_real.py runs the real server, schemas and kubectl; the explain
tests cover the plan and ``--simulate``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from testkit.builders import P, apply, job, job_owner, pod, review
from testkit.kinds import child, jobset, replicated
from testkit.trainer import carried, runtime, trainjob
from testkit.workloads import admitted, mutate, pod_template
from webhook.admission import engine
from webhook.admission import review as admission
from webhook.cluster.version import GivenVersion
from webhook.kinds.trainjob.runtimes import GivenRuntimes
from webhook.kube import failurepolicy as fp
from webhook.kube import restartrules
from webhook.kube.versions import KubeVersion
from webhook.plan import inplace
from webhook.plan.record import rule_id
from webhook.policy.config import Config, ConfigError, parse_config
from webhook.policy.model import Layer, Policy, Scope, Source, parse_annotations, resolve

V134, V135, V136 = KubeVersion(1, 34), KubeVersion(1, 35), KubeVersion(1, 36)
IN_PLACE = {P + "in-place-exit-codes": "42,75"}
DEADLINE = {"activeDeadlineSeconds": 86400}


def rule(action: str = "Restart", codes: tuple[int, ...] = (42, 75)) -> dict[str, Any]:
    return {"action": action, "exitCodes": {"operator": "In", "values": list(codes)}}


def run(
    obj: dict[str, Any],
    version: KubeVersion | None = V136,
    config: Config | None = None,
    runtimes: Any = None,
):
    """Mutate ``obj`` for a cluster of ``version``, then validate the result as the
    validating webhook would; returns the mutating verdict and the object."""
    source = GivenVersion(version) if version else None
    extra = {"version": source} if source else {}
    config = config or Config()
    request = admission.decode(json.dumps(review(obj)))
    given = {"runtimes": runtimes} if runtimes is not None else {}
    verdict = engine.mutate(request, config, **given, **extra)
    if not verdict.allowed:
        return verdict, obj
    out = apply(obj, verdict.patch)
    second = engine.validate(admission.decode(json.dumps(review(out))), config, **given, **extra)
    assert second.allowed, second.message
    again = engine.mutate(admission.decode(json.dumps(review(out))), config, **given, **extra)
    assert again.patch == [], "mutating twice changes something"
    return verdict, out


def denied(verdict) -> str:
    assert not verdict.allowed, verdict.warnings
    return verdict.message


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return obj["spec"]["template"]["spec"]["containers"]


def job_template(name: str) -> dict[str, Any]:
    return {"spec": {**DEADLINE, "template": pod_template(name, restart_policy="Never")}}


def two_containers() -> list[dict[str, Any]]:
    return [
        {"name": "trainer", "image": "ghcr.io/example/train:1.0.0"},
        {"name": "exporter", "image": "ghcr.io/example/exporter:1.0.0"},
    ]


# --- the grammar -------------------------------------------------------------------------


def test_codes_are_sorted_and_deduplicated_as_the_api_requires():
    """``validateContainerRestartPolicy`` wants In values sorted and unique, like
    podFailurePolicy's."""
    verdict, out = run(job({P + "in-place-exit-codes": "75, 42,75"}, spec=DEADLINE))
    assert verdict.allowed, verdict.message
    assert containers(out)[0]["restartPolicyRules"] == [rule()]


# --- a Job -------------------------------------------------------------------------------


def test_each_regular_container_restarts_in_place_sidecars_and_init_are_left_alone():
    obj = job(IN_PLACE, containers=two_containers(), spec=DEADLINE)
    template = obj["spec"]["template"]["spec"]
    template["initContainers"] = [
        {"name": "fetch", "image": "busybox:1.36"},
        {"name": "proxy", "image": "envoy:1.30", "restartPolicy": "Always"},
    ]
    verdict, out = run(obj)
    assert verdict.allowed, verdict.message
    for container in containers(out):
        assert container["restartPolicy"] == "Never"
        assert container["restartPolicyRules"] == [rule()]
    init = out["spec"]["template"]["spec"]["initContainers"]
    assert init == obj["spec"]["template"]["spec"]["initContainers"]
    assert (
        "retry-policy: spec.template: containers trainer, exporter restarts in place on exit "
        "42,75 (in-place-exit-codes)" in verdict.warnings
    )
    applied = json.loads(out["metadata"]["annotations"][P + "applied"])
    assert applied["inPlaceExitCodes"] == [42, 75]
    assert applied["inPlaceScope"] == "container"
    assert dict(verdict.actions) == {"in_place_rules": 2}


def test_a_containers_own_rules_stay_first():
    """The kubelet takes the first rule that matches (``findMatchingContainerRestartRule``),
    so the user's own rules keep deciding the codes they name."""
    own = {"action": "Restart", "exitCodes": {"operator": "In", "values": [3]}}
    trainer = {
        "name": "trainer",
        "image": "ghcr.io/example/train:1.0.0",
        "restartPolicy": "Never",
        "restartPolicyRules": [own],
    }
    verdict, out = run(job(IN_PLACE, containers=[trainer], spec=DEADLINE))
    assert verdict.allowed, verdict.message
    assert containers(out)[0]["restartPolicyRules"] == [own, rule()]


def test_twenty_rules_of_a_containers_own_leave_no_room():
    rules = [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [n]}} for n in range(1, 21)
    ]
    trainer = {
        "name": "trainer",
        "image": "x",
        "restartPolicy": "Never",
        "restartPolicyRules": rules,
    }
    message = denied(run(job(IN_PLACE, containers=[trainer], spec=DEADLINE))[0])
    assert "container trainer already has 20 restartPolicyRules" in message
    assert "at most 20" in message


def test_scope_pod_restarts_every_container():
    """KEP-5532: RestartAllContainers restarts the whole pod on its node."""
    annotations = {**IN_PLACE, P + "in-place-scope": "pod"}
    verdict, out = run(job(annotations, containers=two_containers(), spec=DEADLINE))
    assert verdict.allowed, verdict.message
    assert all(c["restartPolicyRules"] == [rule("RestartAllContainers")] for c in containers(out))
    assert any("the whole pod restarts in place" in w for w in verdict.warnings)


def test_scope_pod_warns_that_pods_stay_pending_without_a_declaring_node():
    """A RestartAllContainers rule makes the pod need a node-declared feature
    (``InferForScheduling`` in k8s.io/component-helpers/nodedeclaredfeatures/features/
    restartallcontainers): the NodeDeclaredFeatures scheduler plugin places it only on
    nodes whose kubelet declares RestartAllContainersOnContainerExits. Said once, at every
    admission (also when the rule is already there), under 120 characters."""
    annotations = {**IN_PLACE, P + "in-place-scope": "pod"}
    verdict, out = run(job(annotations, containers=two_containers(), spec=DEADLINE))
    assert verdict.warnings.count(inplace.NODES_NOTE) == 1
    assert "stay Pending unless a node declares RestartAllContainersOnContainerExits" in (
        inplace.NODES_NOTE
    )
    assert len(inplace.NODES_NOTE) < 120
    again = engine.mutate(
        admission.decode(json.dumps(review(out))), Config(), version=GivenVersion(V136)
    )
    assert again.patch == [] and inplace.NODES_NOTE in again.warnings
    plain, _ = run(job(IN_PLACE, spec=DEADLINE))
    assert inplace.NODES_NOTE not in plain.warnings


# --- versions ------------------------------------------------------------------------------


def test_below_1_35_the_rules_are_denied_naming_1_35():
    """ContainerRestartRules is beta and on by default from 1.35; below it the API server
    drops the fields silently (``dropContainerRestartRules``, from ``dropDisabledFields`` in
    pkg/api/pod/util.go)."""
    message = denied(run(job(IN_PLACE, spec=DEADLINE), V134)[0])
    assert "need Kubernetes 1.35 or newer (ContainerRestartRules)" in message
    assert "this cluster is 1.34" in message


def test_scope_pod_below_1_36_is_denied_naming_1_36():
    annotations = {**IN_PLACE, P + "in-place-scope": "pod"}
    message = denied(run(job(annotations, spec=DEADLINE), V135)[0])
    assert f"annotation {P}in-place-scope" in message
    assert "Kubernetes 1.36 or newer (RestartAllContainersOnContainerExits)" in message


def test_an_unknown_version_writes_nothing_and_says_how_to_pin_it():
    message = denied(run(job(IN_PLACE, spec=DEADLINE), None)[0])
    assert "Kubernetes version is not known" in message
    assert "kubernetesVersion" in message


def test_the_configs_pin_wins_over_the_api_servers_answer():
    config = parse_config('kubernetesVersion: "1.36"\n')
    verdict, out = run(job(IN_PLACE, spec=DEADLINE), V134, config)
    assert verdict.allowed, verdict.message
    assert containers(out)[0]["restartPolicyRules"] == [rule()]


def test_a_default_on_a_too_old_cluster_is_skipped_with_a_warning_not_denied():
    config = parse_config("defaults:\n  in-place-exit-codes: 42\n")
    verdict, out = run(job(spec=DEADLINE), V134, config)
    assert verdict.allowed, verdict.message
    assert "restartPolicyRules" not in containers(out)[0]
    assert any("in-place-exit-codes (cluster default) skipped" in w for w in verdict.warnings)


def test_remembered_answers_are_per_cluster_version():
    """The memo must not answer a 1.36 question with a 1.34 answer (an upgraded cluster)."""
    obj = job(IN_PLACE, spec=DEADLINE)
    assert not run(obj, V134)[0].allowed
    assert run(obj, V136)[0].allowed


@pytest.mark.parametrize(
    ("text", "version"),
    [("1.35", V135), ("v1.36.2", V136), ("v1.35.1-gke.1000", V135)],
)
def test_versions_parse(text, version):
    assert KubeVersion.parse(text) == version


def test_a_servers_minor_with_a_suffix_is_read():
    assert KubeVersion.of_server("1", "35+", "v1.35.2-gke.1") == V135


# --- what it needs -------------------------------------------------------------------------


def test_on_failure_already_restarts_in_place():
    """The denial says what to change and what that changes, as every OnFailure denial
    does (``jobcontroller.never_instead``): under Never the in-place codes still restart
    in place, uncounted (``pastBackoffLimitOnFailure`` counts restarts only under
    OnFailure), and any other failure is retried in a new pod."""
    message = denied(run(job(IN_PLACE, restart_policy="OnFailure", spec=DEADLINE))[0])
    assert "restartPolicy is OnFailure, which already restarts every failed container" in message
    assert message.endswith(
        "accepted: spec.template.spec.restartPolicy: Never, under which an exit with one of "
        "in-place-exit-codes still restarts the container in place, no longer counted "
        "against backoffLimit, and any other failure fails the pod: the retry runs in a new "
        "pod (files in its emptyDir volumes start empty), counted against backoffLimit as "
        "its restarts are now"
    )
    # A bare Pod: nothing retries it.
    on_failure = pod(IN_PLACE, spec={"restartPolicy": "OnFailure", "activeDeadlineSeconds": 9})
    message = denied(run(on_failure)[0])
    assert "accepted: spec.restartPolicy: Never, under which an exit with one of" in message
    assert message.endswith("any other failure fails the pod: nothing retries a bare Pod")


@pytest.mark.parametrize(
    ("own", "when"),
    [("OnFailure", "on any non-zero exit"), ("Always", "on every exit, success too")],
)
def test_a_container_with_its_own_restart_policy_is_left_as_it_is(own, when):
    """A container's own OnFailure restarts it on a non-zero exit, Always on every exit
    (``ContainerShouldRestart`` in pkg/api/v1/pod/util.go): it already restarts in place
    on the in-place codes, so it keeps its policy, takes no rule, and the workload is
    admitted with a warning that says so (and does not claim OnFailure restarts on 0)."""
    exporter = {"name": "exporter", "image": "x", "restartPolicy": own}
    annotations = {**IN_PLACE, P + "fail-non-retriable": "true"}
    obj = job(annotations, containers=[two_containers()[0], exporter], spec=DEADLINE)
    verdict, out = run(obj)
    assert verdict.allowed, verdict.message
    trainer, kept = containers(out)
    assert trainer["restartPolicyRules"] == [rule()]
    assert kept == containers(obj)[1] and kept["restartPolicy"] == own
    note = (
        f"retry-policy: spec.template: container exporter keeps its restartPolicy {own}, "
        f"which restarts it in place {when}"
    )
    assert note in verdict.warnings
    assert "success" not in note or own == "Always"
    # It restarts in place on the in-place codes too: its rule retries them.
    rules = out["spec"]["podFailurePolicy"]["rules"]
    assert fp.non_retriable_rule([42, 75, 143], "FailJob", "exporter") in rules


def test_only_containers_with_their_own_restart_policy_take_no_rule_and_are_admitted():
    trainer = {"name": "trainer", "image": "x", "restartPolicy": "OnFailure"}
    obj = job(IN_PLACE, containers=[trainer], spec=DEADLINE)
    verdict, out = run(obj)
    assert verdict.allowed, verdict.message
    assert containers(out) == containers(obj)
    assert not any("restarts in place on exit" in w for w in verdict.warnings)


def test_without_a_deadline_it_is_denied_naming_the_fields():
    """Under a pod restartPolicy Never the Job controller counts no container restart
    (``pastBackoffLimitOnFailure`` counts them only under OnFailure): only a deadline
    ends a container that always exits 42."""
    message = denied(run(job(IN_PLACE))[0])
    assert "backoffLimit never ends them" in message
    assert "spec.activeDeadlineSeconds (or the pod template's)" in message


def test_the_pod_templates_deadline_bounds_it_too():
    obj = job(IN_PLACE)
    obj["spec"]["template"]["spec"]["activeDeadlineSeconds"] = 3600
    assert run(obj)[0].allowed


def test_an_admins_default_deadline_is_written():
    config = parse_config("guardRails:\n  inPlaceDeadlineSeconds: 7200\n")
    verdict, out = run(job(IN_PLACE), config=config)
    assert verdict.allowed, verdict.message
    assert out["spec"]["activeDeadlineSeconds"] == 7200
    assert any("spec.activeDeadlineSeconds -> 7200" in w for w in verdict.warnings)


def test_unbounded_when_the_admin_allows_it_warns_on_every_admission():
    config = parse_config("guardRails:\n  allowUnboundedInPlace: true\n")
    verdict, out = run(job(IN_PLACE), config=config)
    assert verdict.allowed, verdict.message
    assert "activeDeadlineSeconds" not in out["spec"]
    assert any("in-place restarts are unbounded" in w for w in verdict.warnings)


# --- consistency with the rest of the policy ----------------------------------------------


def on_codes(action: str, values: list[int], container: str | None = None) -> dict[str, Any]:
    codes: dict[str, Any] = {"operator": "In", "values": values}
    if container is not None:
        codes["containerName"] = container
    return {"action": action, "onExitCodes": codes}


@pytest.mark.parametrize("action", ["FailJob", "FailIndex"])
def test_a_rule_of_yours_failing_only_on_in_place_codes_of_its_container_is_denied(action):
    """The container restarts in place on 42 and 75 before its pod could fail with them,
    so a rule naming it and only those codes could never fire."""
    rules = [on_codes(action, [42, 75], "main")]
    spec = {**DEADLINE, "podFailurePolicy": {"rules": rules}}
    if action == "FailIndex":
        spec.update(completionMode="Indexed", completions=2, backoffLimitPerIndex=1)
    message = denied(run(job(IN_PLACE, spec=spec))[0])
    assert (
        f"your spec.podFailurePolicy.rules[0] ({action}) fails only on exit codes 42, 75 of "
        "container main, which restarts in place on them instead: it could never fire"
    ) in message


def test_a_rule_of_yours_without_container_name_still_fires_for_init_containers():
    """``matchOnExitCodes`` (pkg/controller/job/pod_failure_policy.go) reads the regular
    containers' statuses, then the init containers': a rule without containerName fires
    when an init container exits 42, which nothing restarts in place. Admitted, with a
    warning saying for whom it still fires."""
    rules = [on_codes("FailJob", [42])]
    obj = job(IN_PLACE, spec={**DEADLINE, "podFailurePolicy": {"rules": rules}})
    obj["spec"]["template"]["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    verdict, out = run(obj)
    assert verdict.allowed, verdict.message
    assert (
        "retry-policy: your spec.podFailurePolicy.rules[0] fires on exit code 42 only for "
        "init containers: the regular ones restart in place on it" in verdict.warnings
    )
    fetch = fp.PodFailure((fp.ContainerExit("fetch", 42, True),))
    assert fp.evaluate(out["spec"]["podFailurePolicy"]["rules"], fetch).action == "FailJob"


def test_a_rule_of_yours_on_other_codes_too_still_fires_on_them():
    rules = [on_codes("FailJob", [1, 42], "main")]
    obj = job(IN_PLACE, spec={**DEADLINE, "podFailurePolicy": {"rules": rules}})
    verdict, _ = run(obj)
    assert verdict.allowed, verdict.message
    assert (
        "retry-policy: your spec.podFailurePolicy.rules[0] never fires on exit code 42 of "
        "container main: it restarts in place on it" in verdict.warnings
    )


def test_a_rule_of_yours_naming_an_init_container_is_left_alone():
    rules = [on_codes("FailJob", [42], "fetch")]
    obj = job(IN_PLACE, spec={**DEADLINE, "podFailurePolicy": {"rules": rules}})
    obj["spec"]["template"]["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    verdict, _ = run(obj)
    assert verdict.allowed, verdict.message
    assert not any("podFailurePolicy.rules[0]" in w for w in verdict.warnings)


def test_a_catch_all_rule_of_yours_is_no_contradiction():
    """NotIn names the codes it leaves out: it does not ask to fail on an in-place code."""
    rules = [{"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [143]}}]
    obj = job(IN_PLACE, spec={**DEADLINE, "podFailurePolicy": {"rules": rules}})
    assert run(obj)[0].allowed


def test_oom_kills_cannot_both_restart_in_place_and_get_more_memory():
    annotations = {
        P + "in-place-exit-codes": "137",
        P + "oom-memory-factor": "1.5",
        P + "oom-memory-limit": "8Gi",
    }
    trainer = {"name": "main", "image": "x", "resources": {"requests": {"memory": "1Gi"}}}
    message = denied(run(job(annotations, containers=[trainer], spec=DEADLINE))[0])
    assert "137 (an OOM kill) would restart in place" in message


def test_fail_non_retriable_treats_in_place_codes_as_retriable():
    """A pod that terminated with an in-place code (from a node whose kubelet does not
    restart in place) is counted and retried, not failed: ``matchPodFailurePolicy`` finds
    no rule for it, since our NotIn list holds it."""
    annotations = {**IN_PLACE, P + "fail-non-retriable": "true"}
    verdict, out = run(job(annotations, spec=DEADLINE))
    assert verdict.allowed, verdict.message
    rules = out["spec"]["podFailurePolicy"]["rules"]
    assert fp.non_retriable_rule([42, 75, 143], "FailJob", "main") in rules
    failed = fp.PodFailure((fp.ContainerExit("main", 42),))
    assert fp.evaluate(rules, failed) is None
    assert fp.evaluate(rules, fp.PodFailure((fp.ContainerExit("main", 1),))).action == "FailJob"
    assert inplace.retriable(engine_policy(annotations)) == (42, 75, 143)


def test_fail_non_retriable_keeps_the_plain_set_for_init_containers():
    """An init container that exits 42 fails the pod (nothing restarts it in place:
    our rule goes only to regular containers), so its rule keeps the retriable codes
    alone; a native sidecar gets no rule (``app_containers``)."""
    annotations = {**IN_PLACE, P + "fail-non-retriable": "true"}
    obj = job(annotations, spec=DEADLINE)
    obj["spec"]["template"]["spec"]["initContainers"] = [
        {"name": "fetch", "image": "busybox"},
        {"name": "proxy", "image": "envoy", "restartPolicy": "Always"},
    ]
    verdict, out = run(obj)
    assert verdict.allowed, verdict.message
    rules = out["spec"]["podFailurePolicy"]["rules"]
    assert rules[1:] == [
        fp.non_retriable_rule([42, 75, 143], "FailJob", "main"),
        fp.non_retriable_rule([143], "FailJob", "fetch"),
    ]
    # upstream: matchOnExitCodes reads init containers after the regular ones.
    init42 = fp.PodFailure((fp.ContainerExit("fetch", 42, True),))
    assert fp.evaluate(rules, init42).action == "FailJob"
    assert fp.evaluate(rules, fp.PodFailure((fp.ContainerExit("main", 42),))) is None


def engine_policy(annotations: dict[str, str]) -> Policy:
    values, _ = parse_annotations(annotations, Scope.WORKLOAD)
    return resolve([Layer(Source.ANNOTATION, values)])


def test_a_pod_templates_own_in_place_annotation_is_the_wrong_place():
    obj = job(spec=DEADLINE, template_annotations=IN_PLACE)
    message = denied(run(obj)[0])
    assert f"spec.template annotation {P}in-place-exit-codes" in message
    assert "annotate the Job itself" in message


def test_kubelet_back_off_doubles_from_10_seconds_up_to_5_minutes():
    """The kubelet's crash-loop back-off after each restart (``doBackOff``;
    ``MaxContainerBackOff``: 300 s); the first restart is at once."""
    assert [restartrules.backoff_seconds(n) for n in range(1, 8)] == [10, 20, 40, 80, 160, 300, 300]


# --- other kinds -----------------------------------------------------------------------------


def test_a_cronjobs_jobs_get_the_rules_from_its_job_template():
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "annotations": dict(IN_PLACE)},
        "spec": {
            "schedule": "0 3 * * *",
            "jobTemplate": {
                "spec": {**DEADLINE, "template": pod_template("main", restart_policy="Never")}
            },
        },
    }
    verdict, out = run(admitted(manifest))
    assert verdict.allowed, verdict.message
    template = out["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert template["containers"][0]["restartPolicyRules"] == [rule()]


def test_each_replicated_job_of_a_jobset_gets_the_rules():
    jobs = [replicated(name, "Never", **DEADLINE) for name in ("leader", "workers")]
    verdict, out = run(jobset(IN_PLACE, jobs=jobs))
    assert verdict.allowed, verdict.message
    for rjob in out["spec"]["replicatedJobs"]:
        for container in rjob["template"]["spec"]["template"]["spec"]["containers"]:
            assert container["restartPolicyRules"] == [rule()]


def test_a_jobset_without_deadlines_is_denied():
    jobs = [replicated(name, "Never") for name in ("leader", "workers")]
    message = denied(run(jobset(IN_PLACE, jobs=jobs))[0])
    assert "spec.replicatedJobs[0].template.spec.activeDeadlineSeconds" in message


def ignoring(*reasons: str, **rule: Any) -> dict[str, Any]:
    """A JobSet rule that restarts the set without counting against maxRestarts."""
    found = {"name": "again", "action": "RestartJobSetAndIgnoreMaxRestarts", **rule}
    if reasons:
        found["onJobFailureReasons"] = list(reasons)
    return found


@pytest.mark.parametrize(
    "rules",
    [
        [ignoring("DeadlineExceeded")],
        [ignoring()],  # no reasons: every reason, DeadlineExceeded included
        [ignoring(onJobFailureMessagePatterns=["active longer"])],
        [{**ignoring("DeadlineExceeded"), "action": "RestartJobAndIgnoreMaxRestarts"}],
    ],
)
def test_a_jobsets_deadline_is_no_bound_when_a_rule_restarts_past_it_uncounted(rules):
    """A Job past its activeDeadlineSeconds fails with DeadlineExceeded ("Job was active
    longer than specified deadline"); the first JobSet rule that applies decides
    (``findFirstFailedPolicyRuleAndJob``, ``ruleIsApplicable``: a rule without reasons
    applies to every reason), and an ...AndIgnoreMaxRestarts one restarts the set without
    checking maxRestarts (``restartJobSetAndIgnoreMaxRestartsActionApplier`` in
    pkg/controllers/failure_policy.go): the deadline then ends nothing."""
    jobs = [replicated("workers", "Never", **DEADLINE)]
    obj = jobset(IN_PLACE, jobs=jobs, failure_policy={"maxRestarts": 3, "rules": rules})
    message = denied(run(obj)[0])
    assert f"annotation {P}in-place-exit-codes" in message
    assert (
        "restarts in place are not pod failures, and spec.replicatedJobs[0].template.spec."
        f"activeDeadlineSeconds bounds nothing: your spec.failurePolicy.rules[0] "
        f"({rules[0]['action']}) restarts the set without counting when a Job fails with "
        "DeadlineExceeded"
    ) in message
    if "onJobFailureReasons" in rules[0] or "onJobFailureMessagePatterns" in rules[0]:
        assert message.endswith(
            "; drop the rule or set "
            "spec.replicatedJobs[0].template.spec.template.spec.activeDeadlineSeconds"
        )
    else:  # it takes the failures a pod template's deadline ends in too
        assert message.endswith(
            " or when its pods run out of retries, so the pod template's deadline bounds "
            "nothing either; drop them"
        )


@pytest.mark.parametrize(
    "rules",
    [
        [ignoring("BackoffLimitExceeded")],
        [ignoring("DeadlineExceeded", targetReplicatedJobs=["other"])],
        [ignoring(onJobFailureMessagePatterns=["^Container .* exit code 3 "])],
        [{"name": "stop", "action": "FailJobSet"}, ignoring("DeadlineExceeded")],
        [{"name": "count", "action": "RestartJobSet", "onJobFailureReasons": ["DeadlineExceeded"]},
         ignoring()],
    ],
)  # fmt: skip
def test_a_jobsets_deadline_bounds_when_no_uncounted_rule_takes_it_first(rules):
    other = replicated("other", "Never", **DEADLINE)  # bounded by its pods' deadline too
    other["template"]["spec"]["template"]["spec"]["activeDeadlineSeconds"] = 600
    jobs = [replicated("workers", "Never", **DEADLINE), other]
    obj = jobset(IN_PLACE, jobs=jobs, failure_policy={"maxRestarts": 3, "rules": rules})
    verdict, out = run(obj)
    assert verdict.allowed, verdict.message
    assert child(out, 0)["template"]["spec"]["containers"][0]["restartPolicyRules"] == [rule()]


def test_a_jobsets_pod_deadline_bounds_when_deadline_exceeded_is_ignored():
    """The pod template's deadline fails each pod; the Job fails once its pods run out of
    retries (BackoffLimitExceeded), which the rule on DeadlineExceeded does not take."""
    spec = replicated("workers", "Never")
    spec["template"]["spec"]["template"]["spec"]["activeDeadlineSeconds"] = 600
    policy = {"maxRestarts": 3, "rules": [ignoring("DeadlineExceeded")]}
    verdict, _ = run(jobset(IN_PLACE, jobs=[spec], failure_policy=policy))
    assert verdict.allowed, verdict.message
    # ... unless a rule restarts those uncounted too.
    policy = {"maxRestarts": 3, "rules": [ignoring("DeadlineExceeded", "BackoffLimitExceeded")]}
    message = denied(run(jobset(IN_PLACE, jobs=[spec], failure_policy=policy))[0])
    assert "or when its pods run out of retries, so the pod template's deadline bounds" in message


def test_a_jobsets_uncounted_deadline_gets_no_admin_default_deadline():
    """The admin's default deadline would be written as the replicated Job's, which the
    rule makes end nothing: no default, and with the admin's permission a warning."""
    jobs = [replicated("workers", "Never")]
    policy = {"maxRestarts": 3, "rules": [ignoring("DeadlineExceeded")]}
    rails = parse_config("guardRails:\n  inPlaceDeadlineSeconds: 7200\n")
    message = denied(run(jobset(IN_PLACE, jobs=jobs, failure_policy=policy), config=rails)[0])
    assert "bounds nothing" in message
    allowed = parse_config("guardRails:\n  allowUnboundedInPlace: true\n")
    verdict, out = run(jobset(IN_PLACE, jobs=jobs, failure_policy=policy), config=allowed)
    assert verdict.allowed, verdict.message
    assert "activeDeadlineSeconds" not in child(out, 0)
    assert any(
        "in-place restarts are unbounded (guardRails.allowUnboundedInPlace): set "
        "spec.replicatedJobs[0].template.spec.template.spec.activeDeadlineSeconds" in w
        for w in verdict.warnings
    )
    # Without such a rule the default deadline is written.
    verdict, out = run(jobset(IN_PLACE, jobs=jobs), config=rails)
    assert verdict.allowed, verdict.message
    assert child(out, 0)["activeDeadlineSeconds"] == 7200


@pytest.mark.parametrize(
    ("pattern", "fires"),
    [("Container fetch .* exit code 42 ", True), ("Container trainer .* exit code 42 ", False)],
)
def test_a_jobsets_rules_see_an_init_containers_in_place_code_fail_the_job(pattern, fires):
    """fail-non-retriable's rule for an init container fails the Job on 42 (nothing
    restarts it in place), with the Job controller's message naming it
    (``matchPodFailurePolicy``); the trainer's rule never does. A JobSet rule of yours
    that restarts on that message comes before ours (``_check_rules``)."""
    spec = replicated("workers", "Never", **DEADLINE)
    spec["template"]["spec"]["template"]["spec"]["initContainers"] = [
        {"name": "fetch", "image": "busybox"}
    ]
    mine = {
        "name": "retry",
        "action": "RestartJobSet",
        "onJobFailureReasons": ["PodFailurePolicy"],
        "onJobFailureMessagePatterns": [pattern],
    }
    annotations = {**IN_PLACE, P + "fail-non-retriable": "true"}
    obj = jobset(annotations, jobs=[spec], failure_policy={"maxRestarts": 1, "rules": [mine]})
    verdict, out = run(obj)
    if fires:
        assert "your spec.failurePolicy.rules[0] (RestartJobSet) matches Jobs failed by" in (
            denied(verdict)
        )
    else:
        assert verdict.allowed, verdict.message
        assert child(out, 0)["podFailurePolicy"]["rules"][1:] == [
            fp.non_retriable_rule([42, 75, 143], "FailJob", "trainer"),
            fp.non_retriable_rule([143], "FailJob", "fetch"),
        ]


def test_jobsets_own_in_place_restart_owns_in_place_restarts():
    jobs = [replicated("workers", "Never", **DEADLINE)]
    obj = jobset(IN_PLACE, jobs=jobs, failure_policy={"restartStrategy": "InPlaceRestart"})
    message = denied(run(obj)[0])
    assert "restartStrategy InPlaceRestart JobSet's own agent restarts its pods" in message


@pytest.mark.parametrize(
    ("manifest", "why"),
    [
        (
            {
                "apiVersion": "ray.io/v1",
                "kind": "RayJob",
                "metadata": {"name": "ray", "annotations": dict(IN_PLACE)},
                "spec": {"entrypoint": "python x.py"},
            },
            "KubeRay makes its pods",
        ),
        (
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "metadata": {"name": "torch", "annotations": dict(IN_PLACE)},
                "spec": {
                    "pytorchReplicaSpecs": {
                        "Master": {"replicas": 1, "template": pod_template("pytorch")}
                    }
                },
            },
            "the training operator sets its replicas' restart policy",
        ),
    ],
)
def test_kinds_whose_operator_owns_their_pods_are_denied(manifest, why):
    message = denied(run(admitted(manifest))[0])
    assert f"annotation {P}in-place-exit-codes: cannot apply to a {manifest['kind']}" in message
    assert why in message


def test_a_bare_pod_restarts_in_place_within_its_deadline():
    obj = pod(IN_PLACE, spec={"activeDeadlineSeconds": 600})
    verdict, out = run(obj)
    assert verdict.allowed, verdict.message
    assert out["spec"]["containers"][0]["restartPolicyRules"] == [rule()]
    assert json.loads(out["metadata"]["annotations"][P + "applied"]) == {
        "inPlaceExitCodes": [42, 75],
        "inPlaceScope": "container",
        "origins": {"in-place-exit-codes": rule_id(rule())},
        "v": 2,
    }


def test_a_bare_pod_needs_never_and_a_deadline():
    assert "spec.activeDeadlineSeconds" in denied(run(pod(IN_PLACE))[0])
    always = pod(IN_PLACE, spec={"restartPolicy": "Always", "activeDeadlineSeconds": 600})
    assert (
        f"annotation {P}in-place-exit-codes: spec.restartPolicy is 'Always'; "
        "in-place-exit-codes needs Never" in denied(run(always)[0])
    )
    on_failure = pod(IN_PLACE, spec={"restartPolicy": "OnFailure", "activeDeadlineSeconds": 9})
    assert "spec.restartPolicy is OnFailure, which already" in denied(run(on_failure)[0])


def test_a_controllers_pod_is_left_to_its_workloads_template():
    obj = pod(IN_PLACE, owner=job_owner(), spec={"activeDeadlineSeconds": 600})
    verdict, out = run(obj)
    assert verdict.allowed, verdict.message
    assert "restartPolicyRules" not in out["spec"]["containers"][0]
    assert any("set it on the Job that makes this pod" in w for w in verdict.warnings)


# --- TrainJob ----------------------------------------------------------------------------------


def test_a_trainjob_is_bounded_by_its_own_deadline():
    rt = runtime()
    tj = trainjob(IN_PLACE)
    tj["spec"]["activeDeadlineSeconds"] = 86400
    verdict, out = run(tj, runtimes=GivenRuntimes([rt], "ml"))
    assert verdict.allowed, verdict.message
    assert carried(out)[P + "in-place-exit-codes"] == "42,75"
    assert any(
        "JobSet: spec.replicatedJobs[0].template.spec.template" in w for w in verdict.warnings
    )


def test_a_trainjob_without_any_deadline_is_denied_naming_its_own():
    message = denied(run(trainjob(IN_PLACE), runtimes=GivenRuntimes([runtime()], "ml"))[0])
    assert "set spec.activeDeadlineSeconds (or one on every replicated Job" in message


@pytest.mark.parametrize(
    ("rules", "bounded"),
    [
        ([], True),
        ([{"name": "again", "action": "RestartJobSetAndIgnoreMaxRestarts"}], False),
        (
            [
                {
                    "name": "again",
                    "action": "RestartJobSetAndIgnoreMaxRestarts",
                    "onJobFailureReasons": ["PodFailurePolicy"],
                }
            ],
            True,
        ),
    ],
)
def test_a_runtimes_deadline_is_no_bound_when_its_rules_restart_past_it_uncounted(rules, bounded):
    # upstream: restartJobSetAndIgnoreMaxRestartsActionApplier (jobset
    # pkg/controllers/failure_policy.go) never checks maxRestarts, and a rule without
    # onJobFailureReasons applies to DeadlineExceeded too (ruleIsApplicable): the
    # runtime's Job deadline then restarts the set forever, as for a JobSet of one's own.
    policy = {"maxRestarts": 3, "rules": rules} if rules else None
    rt = runtime(failure_policy=policy, job_spec={"activeDeadlineSeconds": 3600})
    verdict, _ = run(trainjob(IN_PLACE), runtimes=GivenRuntimes([rt], "ml"))
    assert verdict.allowed is bounded, verdict.message
    if not bounded:
        assert "set spec.activeDeadlineSeconds (or one on every replicated Job" in (verdict.message)


def test_a_trainjob_gets_the_admins_default_deadline():
    config = parse_config("guardRails:\n  inPlaceDeadlineSeconds: 7200\n")
    verdict, out = run(trainjob(IN_PLACE), config=config, runtimes=GivenRuntimes([runtime()], "ml"))
    assert verdict.allowed, verdict.message
    assert out["spec"]["activeDeadlineSeconds"] == 7200


# --- the config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kubernetesVersion: 1.30\n", 'is not a string; quote it: "1.35"'),
        ('kubernetesVersion: "latest"\n', "a Kubernetes version such as 1.35"),
        ("guardRails:\n  inPlaceDeadlineSeconds: 0\n", "a whole number of seconds >= 1"),
        ("guardRails:\n  allowUnboundedInPlace: yes please\n", "true or false"),
        ("defaults:\n  in-place-scope: node\n", "container (the container that exited)"),
    ],
)
def test_bad_config_values_are_reported(text, message):
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert message in str(err.value)


# --- a CronJob's updates -------------------------------------------------------------------

PINNED = parse_config('kubernetesVersion: "1.36"\n')


def nightly(annotations: dict[str, str]) -> dict[str, Any]:
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "annotations": dict(annotations)},
        "spec": {"schedule": "0 3 * * *", "jobTemplate": job_template("eval")},
    }
    return admitted(manifest, applied=True)


def test_a_cronjob_update_replaces_the_rule_the_old_policy_wrote():
    annotations = {**IN_PLACE, P + "fail-non-retriable": "true"}
    _, old = mutate(nightly(annotations), PINNED)
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][P + "in-place-exit-codes"] = "42"
    verdict, out = mutate(new, PINNED, operation="UPDATE", old=old)
    assert verdict.allowed, verdict.message
    job_spec = out["spec"]["jobTemplate"]["spec"]
    assert job_spec["template"]["spec"]["containers"][0]["restartPolicyRules"] == [
        rule(codes=(42,))
    ]
    assert job_spec["podFailurePolicy"]["rules"] == [
        fp.count_disruptions_rule(),
        fp.non_retriable_rule([42, 143], "FailJob", "eval"),
    ]
    assert mutate(out, PINNED, operation="UPDATE", old=old)[0].patch == []


def test_a_cronjob_update_removing_in_place_takes_its_rule_out():
    annotations = {**IN_PLACE, P + "fail-non-retriable": "true"}
    _, old = mutate(nightly(annotations), PINNED)
    new = copy.deepcopy(old)
    del new["metadata"]["annotations"][P + "in-place-exit-codes"]
    verdict, out = mutate(new, PINNED, operation="UPDATE", old=old)
    assert verdict.allowed, verdict.message
    job_spec = out["spec"]["jobTemplate"]["spec"]
    container = job_spec["template"]["spec"]["containers"][0]
    assert "restartPolicyRules" not in container
    assert "restartPolicy" not in container
    assert job_spec["podFailurePolicy"]["rules"] == [
        fp.count_disruptions_rule(),
        fp.non_retriable_rule([143], "FailJob", "eval"),
    ]


def test_a_cronjob_update_replaces_an_init_containers_rule_too():
    """The old policy gave the init container the plain retriable set and the regular
    one the in-place codes too; both are recognised as ours and replaced, and an
    earlier version's rule (in-place codes in the init container's too) as well."""
    annotations = {**IN_PLACE, P + "fail-non-retriable": "true"}
    cron = nightly(annotations)
    cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"] = [
        {"name": "fetch", "image": "busybox"}
    ]
    _, old = mutate(cron, PINNED)
    job_spec = old["spec"]["jobTemplate"]["spec"]
    assert job_spec["podFailurePolicy"]["rules"][1:] == [
        fp.non_retriable_rule([42, 75, 143], "FailJob", "eval"),
        fp.non_retriable_rule([143], "FailJob", "fetch"),
    ]
    earlier = copy.deepcopy(old)
    earlier_rules = earlier["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]
    earlier_rules[2] = fp.non_retriable_rule([42, 75, 143], "FailJob", "fetch")
    for before in (old, earlier):
        new = copy.deepcopy(before)
        new["metadata"]["annotations"][P + "in-place-exit-codes"] = "42"
        verdict, out = mutate(new, PINNED, operation="UPDATE", old=before)
        assert verdict.allowed, verdict.message
        assert out["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"] == [
            fp.count_disruptions_rule(),
            fp.non_retriable_rule([42, 143], "FailJob", "eval"),
            fp.non_retriable_rule([143], "FailJob", "fetch"),
        ]
