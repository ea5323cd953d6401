"""Failure-aware retries (issue 23): oom-memory-factor, oom-memory-limit, avoid-failed-nodes.

Workload admission (grammar, checks, what is copied onto pod templates), pod admission
from a failure history (memory raised after OOM kills, failed nodes avoided), and the
history itself. The history here is the real ``FailureHistory`` fed failed pods
directly; tests/cluster/test_attempts_failureaware.py feeds it through the attempt
cache's watch of an HTTP Kubernetes API and the real server.
"""

from __future__ import annotations

import copy
import json

import pytest

from testkit.builders import P, job, pod
from testkit.failureaware import AVOID, FACTOR, Source, job_pod, node, sidecar, trainer
from testkit.servers import scaled
from testkit.workloads import (
    admitted,
    assert_idempotent,
    kubectl_patch,
    mutate,
    validate,
    validate_schema,
)
from webhook.cluster import history
from webhook.cluster.history import FailureHistory, HistoryKey, Killed
from webhook.kube.failurepolicy import count_disruptions_rule
from webhook.kube.limitrange import memory_limits
from webhook.kube.podspec import spot_requirements
from webhook.policy.config import ConfigError, parse_config


def denied(verdict) -> str:
    assert not verdict.allowed, verdict.warnings
    return verdict.message


# --- the annotations' grammar and the config -------------------------------------------


def test_a_factor_needs_a_limit_unless_an_admin_default_sets_one():
    obj = job({P + "oom-memory-factor": "1.5"}, containers=[trainer()])
    message = denied(mutate(obj)[0])
    assert f"annotation {P}oom-memory-factor: needs {P}oom-memory-limit" in message
    config = parse_config("defaults:\n  oom-memory-limit: 16Gi\n")
    verdict, out = mutate(obj, config)
    assert verdict.allowed, verdict.message
    annotations = out["spec"]["template"]["metadata"]["annotations"]
    assert annotations[P + "oom-memory-limit"] == "16Gi"


NEEDS_LIMIT = f"annotation {P}oom-memory-factor: needs {P}oom-memory-limit"


def test_a_factor_needs_its_limit_whatever_else_is_wrong_with_the_job():
    """Every problem at once: the limit the factor needs is said beside the pod
    template's restartPolicy, which the factor and the other key need changed, in one
    problem (validation runs the same mutation: it says the same)."""
    obj = job(
        {P + "oom-memory-factor": "1.5", P + "fail-non-retriable": "true"},
        restart_policy="OnFailure",
        containers=[trainer()],
    )
    message = denied(mutate(obj)[0])
    assert "2 problems" in message
    assert NEEDS_LIMIT in message
    assert (
        f"annotation {P}fail-non-retriable and annotation {P}oom-memory-factor: "
        "spec.template.spec.restartPolicy is OnFailure"
    ) in message
    assert validate(obj).message == message


def test_a_factor_needs_its_limit_beside_a_pods_bad_value():
    """A pod's bad value stops its admission before anything is given to it; the needs
    of its other keys are said with it."""
    obj = pod({P + "oom-memory-factor": "1.5", P + "attempt": "x"})
    message = denied(mutate(obj)[0])
    assert message.startswith("retry-policy: 2 problems: ")
    assert f"annotation {P}attempt: 'x' is not valid" in message
    assert NEEDS_LIMIT in message


def test_a_limit_below_a_containers_memory_request_is_denied():
    obj = job({**FACTOR, P + "oom-memory-limit": "1Gi"}, containers=[trainer("2Gi")])
    message = denied(mutate(obj)[0])
    assert (
        f"annotation {P}oom-memory-limit: 1Gi is below the memory request of container "
        "trainer (2Gi) in spec.template; accepted: a quantity of at least 2Gi"
    ) in message


def test_a_limit_only_container_has_that_limit_as_request():
    # upstream: SetDefaults_Pod (pkg/apis/core/v1/defaults.go) gives a pod's container
    # without a request its limit as request; a pod template keeps neither.
    container = {"name": "main", "image": "x:1", "resources": {"limits": {"memory": "4Gi"}}}
    obj = job({**FACTOR, P + "oom-memory-limit": "2Gi"}, containers=[container])
    assert "container main (4Gi)" in denied(mutate(obj)[0])
    made = pod({}, spec={"containers": [copy.deepcopy(container)]})
    assert made["spec"]["containers"][0]["resources"]["requests"] == {"memory": "4Gi"}


def test_the_guard_rail_caps_the_limit_cluster_wide():
    config = parse_config("guardRails:\n  maxOomMemoryLimit: 4Gi\n")
    verdict, _ = mutate(job(FACTOR, containers=[trainer()]), config)
    assert verdict.code == 403
    assert "8Gi is above this cluster's limit; accepted: a quantity up to 4Gi" in verdict.message
    with pytest.raises(ConfigError, match="oom-memory-limit: 8Gi is above the guard rail"):
        parse_config("defaults:\n  oom-memory-limit: 8Gi\nguardRails:\n  maxOomMemoryLimit: 4Gi\n")


def test_config_accepts_the_keys_as_yaml_writes_them():
    config = parse_config(
        "defaults:\n  oom-memory-factor: 1.5\n  oom-memory-limit: 16Gi\n"
        "  avoid-failed-nodes: true\nguardRails:\n  maxAvoidedNodes: 5\n"
    )
    assert str(config.defaults["oom-memory-limit"]) == "16Gi"
    assert config.rails(None).max_avoided_nodes == 5
    for bad, where in [
        ("defaults:\n  oom-memory-factor: 0.9\n", "defaults.oom-memory-factor"),
        ("guardRails:\n  maxAvoidedNodes: 0\n", "guardRails.maxAvoidedNodes"),
        ("guardRails:\n  maxOomMemoryLimit: lots\n", "guardRails.maxOomMemoryLimit"),
    ]:
        with pytest.raises(ConfigError, match=where):
            parse_config(bad)


# --- workload admission -------------------------------------------------------------------


def test_a_job_passes_the_settings_to_its_pods_and_says_what_they_do():
    obj = job({**FACTOR, **AVOID}, containers=[trainer()], applied=True)
    once = assert_idempotent(obj)
    verdict, _ = mutate(obj)
    assert once["spec"]["template"]["metadata"]["annotations"] == {
        P + "oom-memory-factor": "1.5",
        P + "oom-memory-limit": "8Gi",
        P + "avoid-failed-nodes": "true",
    }
    assert (
        "retry-policy: a container OOM-killed gets x1.5 the memory it was killed at in later "
        "attempts, at most 8Gi"
    ) in verdict.warnings
    assert (
        "retry-policy: each new attempt keeps off the nodes where earlier attempts failed "
        "(the last 3 of them)"
    ) in verdict.warnings
    record = json.loads(once["metadata"]["annotations"][P + "applied"])
    assert record == {
        "avoidFailedNodes": True,
        "backoffLimit": 6,
        "oomMemoryFactor": "1.5",
        "oomMemoryLimit": "8Gi",
        "v": 2,
    }
    validate_schema(once)
    # A Job annotated but not mutated (the mutating webhook did not run) is denied.
    assert "the policy you annotated was not applied" in validate(obj).message


def test_in_place_restarts_leave_nothing_to_change():
    obj = job({**FACTOR, **AVOID}, restart_policy="OnFailure", containers=[trainer()])
    message = denied(mutate(obj)[0])
    assert (
        f"annotation {P}oom-memory-factor and annotation {P}avoid-failed-nodes: "
        "spec.template.spec.restartPolicy is OnFailure: oom-memory-factor and "
        "avoid-failed-nodes act on the new pod of a later attempt"
    ) in message
    assert "accepted: spec.template.spec.restartPolicy: Never" in message


OOM = {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [137]}}


def test_a_rule_of_yours_that_fails_the_job_on_137_is_a_contradiction():
    # upstream: matchPodFailurePolicy (pkg/controller/job/pod_failure_policy.go): the
    # first rule that matches the OOM-killed pod decides; FailJob ends the Job.
    count = {"action": "Count", "onExitCodes": {"operator": "In", "values": [1]}}
    obj = job(FACTOR, containers=[trainer()], spec={"podFailurePolicy": {"rules": [count, OOM]}})
    message = denied(mutate(obj)[0])
    assert (
        "your spec.podFailurePolicy.rules[1] (FailJob) matches a pod whose container trainer "
        "was OOM-killed (exit code 137)"
    ) in message
    # Counted first, the OOM kill is retried: fine.
    retried = {"action": "Count", "onExitCodes": {"operator": "In", "values": [137]}}
    obj = job(FACTOR, containers=[trainer()], spec={"podFailurePolicy": {"rules": [retried, OOM]}})
    assert mutate(obj)[0].allowed


def test_fail_non_retriable_retries_137_when_its_codes_are_not_yours():
    obj = job({**FACTOR, P + "fail-non-retriable": "true"}, containers=[trainer()])
    verdict, out = mutate(obj)
    count, rule = out["spec"]["podFailurePolicy"]["rules"]
    assert count == count_disruptions_rule()
    assert rule["onExitCodes"]["values"] == [137, 143]
    assert any("exit code 137 added to retriable-exit-codes" in w for w in verdict.warnings)
    assert json.loads(out["metadata"]["annotations"][P + "applied"])["failNonRetriable"] == [
        137,
        143,
    ]
    assert_idempotent(obj)


@pytest.mark.parametrize(
    ("annotations", "warned"),
    [
        ({**FACTOR, P + "fail-non-retriable": "true"}, True),
        ({P + "fail-non-retriable": "true", P + "retriable-exit-codes": "137"}, True),
        ({P + "fail-non-retriable": "true"}, False),  # 137 not retried: nothing promised
        (FACTOR, False),  # every exit code retried: an OOM kill is, whatever its code
    ],
)
def test_where_an_oom_kill_may_not_exit_137_fail_non_retriable_says_so(annotations, warned):
    # upstream: generateLinuxContainerResources (pkg/kubelet/kuberuntime/
    # kuberuntime_container_linux.go) sets memory.oom.group on cgroup v2 unless
    # singleProcessOOMKill; NewMainKubelet (pkg/kubelet/kubelet.go) makes it true on
    # cgroup v1. One process killed, the container may exit with another code, which
    # matchOnExitCodes (pkg/controller/job/pod_failure_policy.go) takes as it is.
    from webhook.plan.failureaware import OOM_SIGNAL

    verdict, out = mutate(job(annotations, containers=[trainer()]))
    assert verdict.allowed
    assert (OOM_SIGNAL in verdict.warnings) is warned
    assert len(OOM_SIGNAL) < 120
    again, _ = mutate(out)  # said with the rule: not by a reinvocation that adds none
    assert again.patch == [] and OOM_SIGNAL not in again.warnings


def test_retriable_codes_you_wrote_without_137_are_a_contradiction():
    annotations = {**FACTOR, P + "fail-non-retriable": "true", P + "retriable-exit-codes": "143"}
    message = denied(mutate(job(annotations, containers=[trainer()]))[0])
    assert (
        f"annotation {P}oom-memory-factor: an OOM kill exits 137, which retriable-exit-codes "
        "(143) does not retry"
    ) in message


def test_a_default_factor_that_cannot_apply_is_skipped_with_a_warning():
    config = parse_config("defaults:\n  oom-memory-factor: 1.5\n  oom-memory-limit: 8Gi\n")
    obj = job(containers=[trainer()], spec={"podFailurePolicy": {"rules": [OOM]}})
    verdict, out = mutate(obj, config)
    assert verdict.allowed
    assert any("oom-memory-factor (cluster default) skipped" in w for w in verdict.warnings)
    annotations = out["spec"]["template"].get("metadata", {}).get("annotations", {})
    assert P + "oom-memory-factor" not in annotations


def test_an_indexed_job_says_per_index():
    spec = {"completionMode": "Indexed", "completions": 4, "backoffLimitPerIndex": 2}
    verdict, _ = mutate(job(FACTOR, containers=[trainer()], spec=spec))
    assert any("in later attempts of its index" in w for w in verdict.warnings)


def cronjob(annotations):
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "annotations": annotations},
        "spec": {
            "schedule": "0 3 * * *",
            "jobTemplate": {
                "spec": {
                    "template": {"spec": {"restartPolicy": "Never", "containers": [trainer()]}}
                }
            },
        },
    }
    return admitted(manifest)


def test_a_cronjobs_jobs_get_the_settings_and_a_changed_policy_replaces_them():
    verdict, once = mutate(cronjob({**FACTOR, **AVOID}))
    assert verdict.allowed, verdict.message
    template = once["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"]
    assert template[P + "oom-memory-factor"] == "1.5"
    validate_schema(once)
    # The user drops avoid-failed-nodes: the copy on the template goes too.
    changed = copy.deepcopy(once)
    del changed["metadata"]["annotations"][P + "avoid-failed-nodes"]
    verdict, twice = mutate(changed, operation="UPDATE", old=once)
    template = twice["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"]
    assert P + "avoid-failed-nodes" not in template and P + "oom-memory-factor" in template


def jobset(annotations, rules=None, per_index=False):
    job_spec = {"template": {"spec": {"restartPolicy": "Never", "containers": [trainer()]}}}
    if per_index:
        job_spec.update(completionMode="Indexed", completions=2, backoffLimitPerIndex=1)
    manifest = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "llm", "annotations": annotations},
        "spec": {
            "replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": job_spec}}]
        },
    }
    if rules is not None:
        manifest["spec"]["failurePolicy"] = {"maxRestarts": 3, "rules": rules}
    return admitted(manifest)


def test_a_jobsets_own_admission_writes_no_lineage_of_its_own():
    """On CREATE the JobSet has no UID yet (``rest.WipeObjectMetaSystemFields`` in
    k8s.io/apiserver pkg/endpoints/handlers/create.go), so nothing can tie its pods
    together at its admission: JobSet's own pod labels do (``labelAndAnnotateObject``)."""
    obj = jobset({**FACTOR, P + "backoff-limit": "3"})
    assert "uid" not in obj["metadata"]
    verdict, out = mutate(obj)
    assert verdict.allowed, verdict.message
    template = out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert P + "jobset-uid" not in template["metadata"]["annotations"]
    assert template["metadata"]["annotations"][P + "oom-memory-factor"] == "1.5"
    validate_schema(out)
    second, again = mutate(out)
    assert second.patch == [] and again == out


@pytest.mark.parametrize(
    ("rule", "per_index", "fails"),
    [
        ({"action": "FailJobSet", "onJobFailureReasons": ["BackoffLimitExceeded"]}, False, True),
        ({"action": "FailJobSet"}, False, True),  # no reasons: every failure
        ({"action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}, False, False),
        ({"action": "FailJobSet", "onJobFailureReasons": ["FailedIndexes"]}, True, True),
        # (a target that is no replicated Job of the set is refused, as JobSet refuses it)
        ({"action": "FailJobSet", "targetReplicatedJobs": ["workers"]}, False, True),
        (
            {"action": "FailJobSet", "onJobFailureMessagePatterns": ["backoff limit"]},
            False,
            True,
        ),
        ({"action": "FailJobSet", "onJobFailureMessagePatterns": ["^Pod .*"]}, False, False),
        ({"action": "RestartJobSet"}, False, False),  # first match wins: restarted
    ],
)
def test_a_jobset_rule_that_fails_the_set_when_an_oom_ends_a_child_is_a_contradiction(
    rule, per_index, fails
):
    # upstream: ruleIsApplicable (jobset pkg/controllers/failure_policy.go): reasons,
    # target replicated Jobs and message patterns; the first applicable rule wins.
    rules = [dict(rule, name="mine")]
    if rule["action"] == "RestartJobSet":
        rules.append({"name": "then", "action": "FailJobSet"})
    verdict, _ = mutate(jobset(FACTOR, rules, per_index))
    assert (not verdict.allowed) is fails, verdict.message
    if fails:
        assert "the JobSet would fail instead of restarting with more memory" in verdict.message


@pytest.mark.parametrize("kind", ["RayJob", "PyTorchJob"])
def test_kinds_whose_pods_belong_to_no_job_deny_it(kind):
    from testkit.kinds import pytorchjob, rayjob

    obj = rayjob(FACTOR) if kind == "RayJob" else pytorchjob(FACTOR)
    assert f"annotation {P}oom-memory-factor: cannot apply to a {kind}" in denied(mutate(obj)[0])


# --- pod admission ------------------------------------------------------------------------


def memory(obj, name="trainer"):
    container = next(c for c in obj["spec"]["containers"] if c["name"] == name)
    return container["resources"]["requests"].get("memory"), container["resources"].get(
        "limits", {}
    ).get("memory")


def fields(obj):
    terms = obj["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    return terms["nodeSelectorTerms"]


def test_the_first_attempt_is_left_as_it_is():
    source = Source()
    verdict, out = mutate(job_pod(), attempts=source)
    assert verdict.allowed and memory(out) == ("2Gi", "2Gi") and "affinity" not in out["spec"]


def test_an_oom_killed_container_gets_more_memory_each_time_up_to_the_limit(tmp_path):
    source = Source()
    out = job_pod()
    expected = [("3Gi", "3Gi"), ("4608Mi", "4608Mi"), ("6912Mi", "6912Mi"), ("8Gi", "8Gi")]
    for kills, wanted in enumerate(expected, 1):
        source.fail(out, node=f"node-{kills}")  # the attempt before, with what it got
        new = job_pod()
        verdict, out = mutate(new, attempts=source)
        assert verdict.allowed, verdict.message
        assert memory(out) == wanted, kills
        assert memory(out, "logger") == ("64Mi", None)  # never OOM-killed: untouched
        assert out["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"
        validate_schema(out)
        assert kubectl_patch(new, verdict.patch, tmp_path) == out
    assert (
        "retry-policy: container trainer was OOM-killed 4 times before at 6912Mi: memory "
        "request 2Gi -> 8Gi, limit 2Gi -> 8Gi (x1.5, at most oom-memory-limit 8Gi)"
    ) in verdict.warnings
    assert dict(verdict.actions) == {"memory_raised": 1, "nodes_avoided": 3}
    applied = json.loads(out["metadata"]["annotations"][P + "applied"])
    assert applied == {"avoidedNodes": 3, "memoryRaised": {"trainer": 4}, "v": 2}


def test_memory_is_never_lowered_and_a_missing_limit_stays_missing():
    source = Source()
    big = job_pod(containers=[trainer("2Gi", limit="16Gi")])
    source.fail(big)
    _, out = mutate(big, attempts=source)
    assert memory(out) == ("3Gi", "16Gi")  # the limit is above oom-memory-limit: kept
    no_limit = job_pod(containers=[trainer("2Gi", limit=None)])
    _, out = mutate(no_limit, attempts=source)
    assert memory(out) == ("3Gi", None)


def test_an_oom_killed_init_container_gets_more_memory_too():
    source = Source()
    spec = {"initContainers": [trainer("1Gi", "1Gi", name="fetch")]}
    first = job_pod(spec=spec)
    failed = copy.deepcopy(first)
    failed["metadata"]["uid"] = "init-oom"
    failed["status"] = {
        "phase": "Failed",
        "initContainerStatuses": [
            {"name": "fetch", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
        ],
    }
    source.history.record(failed, "job-1", True)
    source.failures = 1
    _, out = mutate(job_pod(spec=spec), attempts=source)
    fetch = out["spec"]["initContainers"][0]["resources"]
    assert fetch == {"requests": {"cpu": "1", "memory": "1536Mi"}, "limits": {"memory": "1536Mi"}}
    assert memory(out) == ("2Gi", "2Gi")


def test_reinvocation_raises_nothing_again():
    source = Source()
    source.fail(job_pod())
    verdict, once = mutate(job_pod(), attempts=source)
    again, twice = mutate(once, attempts=source)
    assert verdict.patch and again.patch == [] and twice == once


def test_an_indexed_job_learns_per_index():
    source = Source()

    def indexed(i, failures):
        return job_pod(index=i, index_failures=failures)

    source.fail(indexed(0, 0), node="node-a")
    _, zero = mutate(indexed(0, 1), attempts=source)
    _, one = mutate(indexed(1, 0), attempts=source)
    assert memory(zero) == ("3Gi", "3Gi") and memory(one) == ("2Gi", "2Gi")
    assert "affinity" not in one["spec"] and fields(zero)[0]["matchFields"][0]["values"] == [
        "node-a"
    ]


def test_failed_nodes_are_anded_into_every_term_like_the_non_spot_placement():
    source = Source(nodes=[node("spare", {"zone": "a"})])
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": []},  # matches no node: left as it is
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n9"]}]},
                ]
            }
        }
    }
    annotations = {**AVOID, P + "backoff-limit": "3", P + "non-spot-attempts": "4"}
    first = job_pod(annotations, spec={"affinity": affinity})
    for name in ("n1", "n2", "n3", "n4"):
        source.fail(first, node=name)
    _, out = mutate(job_pod(annotations, spec={"affinity": affinity}), attempts=source)
    terms = fields(out)
    avoid = [
        {"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in ("n2", "n3", "n4")
    ]
    assert terms[0] == {"matchExpressions": []}
    assert terms[1]["matchExpressions"][1:] == spot_requirements(parse_config("").spot_node_labels)
    assert terms[1]["matchFields"] == avoid  # the last 3: guardRails.maxAvoidedNodes
    assert terms[2]["matchFields"][1:] == avoid
    validate_schema(out)


def test_the_number_of_nodes_avoided_is_the_admins_to_choose():
    source = Source()
    first = job_pod(AVOID)
    for name in ("n1", "n2"):
        source.fail(first, node=name)
    config = parse_config("guardRails:\n  maxAvoidedNodes: 1\n")
    _, out = mutate(job_pod(AVOID), attempts=source, config=config)
    assert [r["values"] for r in fields(out)[0]["matchFields"]] == [["n2"]]


def test_a_pod_that_may_only_run_where_it_failed_is_not_kept_off_it():
    source = Source()
    pinned = {"nodeSelector": {"kubernetes.io/hostname": "node-a"}}
    source.fail(job_pod(AVOID, spec=pinned))
    verdict, out = mutate(job_pod(AVOID, spec=pinned), attempts=source)
    assert "affinity" not in out["spec"]
    assert any(
        "may only run there (nodeSelector kubernetes.io/hostname=node-a)" in w
        for w in verdict.warnings
    )


def test_a_pod_stopped_while_being_deleted_did_not_fail_its_node():
    source = Source()
    source.fail(job_pod(), node="node-a", deleting=True)
    _, out = mutate(job_pod(), attempts=source)
    assert "affinity" not in out["spec"] and memory(out) == ("3Gi", "3Gi")


def test_without_a_history_the_pod_is_admitted_unchanged_with_a_warning():
    for source in (None, Source(failures=None)):
        verdict, _ = mutate(job_pod(), attempts=source)
        assert verdict.allowed and verdict.patch == []
        assert any(
            w.startswith("retry-policy: failure history unknown (") for w in verdict.warnings
        )
        assert any(
            "pod admitted without memory raise and node avoidance" in w for w in verdict.warnings
        )


def test_a_controllers_pod_with_a_bad_limit_is_admitted_with_a_warning_a_bare_one_denied():
    bad = {P + "oom-memory-factor": "1.5", P + "oom-memory-limit": "1Gi"}
    verdict, _ = mutate(job_pod(bad), attempts=Source())
    assert verdict.allowed
    assert any(
        "not applied to this pod" in w and "below the memory request" in w for w in verdict.warnings
    )
    verdict, _ = mutate(pod(bad, spec={"containers": [trainer()]}), attempts=Source())
    assert (
        not verdict.allowed and "below the memory request of container trainer" in verdict.message
    )


def test_many_long_node_names_fit_a_warning():
    source = Source()
    first = job_pod(AVOID)
    for i in range(3):
        source.fail(first, node=f"ip-10-0-{i}-1.{'very-long-zone-name.' * 4}compute.internal")
    verdict, _ = mutate(job_pod(AVOID), attempts=source)
    assert all(len(w) <= 250 for w in verdict.warnings)
    assert any("and 2 more" in w or "and 1 more" in w for w in verdict.warnings)
    one = Source()
    one.fail(job_pod(AVOID), node="n" * 253)  # as long as a node name may be
    verdict, _ = mutate(job_pod(AVOID), attempts=one)
    (warning,) = [w for w in verdict.warnings if "keeping off" in w]
    assert len(warning) <= 250 and warning.endswith("n...")


def test_a_remembered_answer_is_not_reused_after_another_failure():
    source = Source()
    first = job_pod()
    source.fail(first)
    _, a = mutate(job_pod(), attempts=source)
    _, b = mutate(job_pod(), attempts=source)  # the same view, the same history: remembered
    source.fail(a, node="node-b")
    _, c = mutate(job_pod(), attempts=source)
    assert memory(a) == memory(b) == ("3Gi", "3Gi") and memory(c) == ("4608Mi", "4608Mi")


def jobset_meta(jobset_uid="set-1", index="1", run="0", with_uid=True):
    """The labels JobSet puts on every pod of a child Job (``labelAndAnnotateObject`` in
    jobset pkg/controllers/jobset_controller.go; the UID label since v0.9.0)."""
    labels = {
        "jobset.sigs.k8s.io/jobset-name": "train",
        "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        "jobset.sigs.k8s.io/job-index": index,
        "jobset.sigs.k8s.io/restart-attempt": run,
    }
    if with_uid:
        labels["jobset.sigs.k8s.io/jobset-uid"] = jobset_uid
    return {"labels": labels}


def test_a_jobset_pod_learns_from_the_runs_before_its_child_job_was_recreated():
    # upstream: labelAndAnnotateObject (jobset pkg/controllers/jobset_controller.go) puts
    # jobset-uid, replicatedjob-name, job-index and restart-attempt on every pod; a restart
    # deletes the child Jobs and makes new ones, under new UIDs.
    source = Source()
    run0 = job_pod(job_uid="child-run-0", meta=jobset_meta())
    source.fail(run0, job_uid="child-run-0")
    source.failures = 0  # the new child Job of the next run has failed 0 times
    run1 = jobset_meta(run="1")
    verdict, out = mutate(job_pod(job_uid="child-run-1", meta=run1), attempts=source)
    assert memory(out) == ("3Gi", "3Gi"), verdict.warnings
    assert not any("JobSet" in w for w in verdict.warnings), verdict.warnings
    other = jobset_meta(index="0", run="1")  # another replica: its own history
    _, out = mutate(job_pod(job_uid="child-run-1", meta=other), attempts=source)
    assert memory(out) == ("2Gi", "2Gi")
    another_set = jobset_meta(jobset_uid="set-2", run="0")  # same names, another JobSet
    _, out = mutate(job_pod(job_uid="child-2", meta=another_set), attempts=source)
    assert memory(out) == ("2Gi", "2Gi")


def test_a_jobset_run_whose_earlier_runs_left_no_record_says_so():
    """A replica started after a restart deleted the failed pods of run 0 knows nothing of
    them: the pod of run 1 is told, not silently given the first attempt's memory."""
    source = Source()
    run1 = job_pod(job_uid="child-run-1", meta=jobset_meta(run="1"))
    verdict, out = mutate(run1, attempts=source)
    assert verdict.allowed and memory(out) == ("2Gi", "2Gi")
    assert any("JobSet run 0 left no failed pod on record here" in w for w in verdict.warnings), (
        verdict.warnings
    )
    # Run 0 of the same set is the first: nothing earlier to miss.
    verdict, _ = mutate(job_pod(job_uid="child-run-0", meta=jobset_meta()), attempts=source)
    assert not any("JobSet" in w for w in verdict.warnings), verdict.warnings


def test_a_pod_of_a_jobset_older_than_0_9_is_told_its_earlier_runs_are_unknown():
    source = Source()
    old = jobset_meta(run="2", with_uid=False)
    run0 = job_pod(job_uid="child-run-0", meta=old)
    source.fail(run0, job_uid="child-run-0")
    verdict, out = mutate(job_pod(job_uid="child-run-0", meta=old), attempts=source)
    assert memory(out) == ("3Gi", "3Gi")  # its own child Job's failures still count
    (warning,) = [w for w in verdict.warnings if "JobSet" in w]
    assert warning == (
        "retry-policy: no jobset.sigs.k8s.io/jobset-uid label (JobSet < v0.9.0): "
        "earlier runs unknown, this run's failures only"
    )
    assert len(warning) <= 120


def test_siblings_oom_killed_at_one_size_raise_it_once(tmp_path):
    """Parallel pods of one Job OOM-killed at 2Gi prove 2Gi too small once: the next pod
    gets 2Gi x1.5, not 2Gi x1.5^4 (factor to the power of every kill in the Job)."""
    source = Source()
    for name in ("n1", "n2", "n3", "n4"):
        source.fail(job_pod(), node=name)
    new = job_pod()
    verdict, out = mutate(new, attempts=source)
    assert memory(out) == ("3Gi", "3Gi")
    assert (
        "retry-policy: container trainer was OOM-killed 4 times before at 2Gi: memory "
        "request 2Gi -> 3Gi, limit 2Gi -> 3Gi (x1.5)"
    ) in verdict.warnings
    assert kubectl_patch(new, verdict.patch, tmp_path) == out


def test_the_raise_starts_from_the_memory_an_in_place_resize_gave():
    # upstream: KEP-1287 "API Changes": status.containerStatuses[].resources holds the
    # actual resources of a running container and the allocated ones of a stopped one;
    # convertContainerStatusResources (pkg/kubelet/kubelet_pods.go). The spec holds the
    # desired size, which a resize that was not actuated never reached.
    source = Source()
    resized = {
        "name": "trainer",
        "resources": {"requests": {"memory": "4Gi"}, "limits": {"memory": "5Gi"}},
        "allocatedResources": {"memory": "4Gi"},
    }
    failed = source.fail(job_pod())
    failed["metadata"]["uid"] = "resized"
    failed["status"]["containerStatuses"][0].update(resized)
    assert source.history.record(failed, "job-1", True)
    verdict, out = mutate(job_pod(), attempts=source)
    assert memory(out) == ("6Gi", "7680Mi"), verdict.warnings
    # Without the status field (kubelets that leave it out), the spec it was killed at.
    assert history.killed_at(source.fail(job_pod())) == [Killed("trainer", 1, 2**31, 2**31)]


def test_the_new_pods_own_memory_is_never_lowered():
    source = Source()
    source.fail(job_pod())  # killed at 2Gi: 3Gi wanted
    _, out = mutate(job_pod(containers=[trainer("4Gi", "4Gi"), sidecar()]), attempts=source)
    assert memory(out) == ("4Gi", "4Gi")


def limit_range(*items, name="mem"):
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"limits": list(items)},
    }


def container_limits(max_memory=None, ratio=None):
    item = {"type": "Container"}
    if max_memory:
        item["max"] = {"memory": max_memory}
    if ratio:
        item["maxLimitRequestRatio"] = {"memory": ratio}
    return item


@pytest.mark.parametrize("version", ["1.35", "1.36", "1.37"])
def test_a_raise_stops_at_the_limitranges_container_max(tmp_path, version):
    # upstream: PodValidateLimitFunc, maxConstraint (plugin/pkg/admission/limitranger/
    # admission.go): every container's and init container's limit and request <= max.
    ranges = [limit_range(container_limits("6Gi")), limit_range(container_limits("5Gi"), name="b")]
    source = Source(limit_ranges=ranges)
    out = job_pod()
    for _ in range(3):
        source.fail(out)
        new = job_pod()
        verdict, out = mutate(new, attempts=source)
    assert memory(out) == ("5Gi", "5Gi")  # the tighter of the two
    assert (
        "retry-policy: container trainer was OOM-killed 3 times before at 4608Mi: memory "
        "request 2Gi -> 5Gi, limit 2Gi -> 5Gi (x1.5, at most LimitRange ml/b container max 5Gi)"
    ) in verdict.warnings
    assert kubectl_patch(new, verdict.patch, tmp_path) == out
    validate_schema(out, version)


def test_a_raise_keeps_the_limit_within_the_ratio_to_the_request():
    # upstream: limitRequestRatioConstraint (plugin/pkg/admission/limitranger/admission.go):
    # limit / request <= maxLimitRequestRatio. Here the limit (killed at 2Gi) would grow
    # to 3Gi while the request, already above 1.5x what it was killed at, stays 1536Mi.
    source = Source(limit_ranges=[limit_range(container_limits(ratio="1.5"))])
    source.fail(job_pod(containers=[trainer("1Gi", "2Gi")]))
    _, out = mutate(job_pod(containers=[trainer("1536Mi", "2Gi")]), attempts=source)
    assert memory(out) == ("1536Mi", "2304Mi")  # 1536Mi x 1.5
    from webhook.kube import limitrange

    limits = memory_limits(source.ranges)
    assert limitrange.violations(out["spec"], limits) == set()


def test_a_raise_stops_at_the_pods_max_counting_init_containers_as_the_api_does():
    # upstream: podLimits / podRequests (plugin/pkg/admission/limitranger/admission.go):
    # containers and sidecars add up; an init container counts with the sidecars before
    # it; the pod's total is the largest of those.
    pod_max = {"type": "Pod", "max": {"memory": "4Gi"}}
    source = Source(limit_ranges=[limit_range(pod_max)])
    sidecar_ = {**sidecar(), "restartPolicy": "Always"}
    sidecar_["resources"] = {"requests": {"memory": "512Mi"}, "limits": {"memory": "512Mi"}}
    init = trainer("3Gi", "3Gi", name="fetch")
    spec = {"initContainers": [sidecar_, init]}
    containers = [trainer("1Gi", "1Gi")]
    source.fail(job_pod(containers=containers, spec=spec))  # trainer killed at 1Gi
    _, out = mutate(job_pod(containers=containers, spec=spec), attempts=source)
    # 1536Mi wanted; the pod: max(1536Mi + 512Mi, 3Gi + 512Mi) = 3.5Gi <= 4Gi: fits.
    assert memory(out) == ("1536Mi", "1536Mi")
    source.fail(out, oom=("trainer",))
    failed = source.fail(job_pod(containers=containers, spec=spec), oom=())
    failed["metadata"]["uid"] = "init-oom"
    failed["status"]["initContainerStatuses"] = [
        {"name": "fetch", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
    ]
    assert source.history.record(failed, "job-1", True)
    verdict, out = mutate(job_pod(containers=containers, spec=spec), attempts=source)
    fetch = out["spec"]["initContainers"][1]["resources"]
    # fetch: 3Gi + 512Mi of sidecar before it is the pod's total: only 512Mi more fits.
    assert fetch["limits"]["memory"] == "3584Mi" and fetch["requests"]["memory"] == "3584Mi"
    # trainer: 2304Mi wanted; with the sidecar 2816Mi <= 4Gi.
    assert memory(out) == ("2304Mi", "2304Mi")
    assert any("at most LimitRange ml/mem pod max 4Gi" in w for w in verdict.warnings)


def test_a_raise_the_namespace_would_still_refuse_is_not_made():
    # The pod's ratio (type Pod) holds for the pod as it came; a raise of one container
    # that breaks it is given up whole, with a warning.
    # upstream: limitRequestRatioConstraint on podRequests / podLimits (plugin/pkg/
    # admission/limitranger/admission.go): a container without a limit adds none.
    pod_ratio = {"type": "Pod", "maxLimitRequestRatio": {"memory": "1"}}
    source = Source(limit_ranges=[limit_range(pod_ratio)])
    no_limit = {**sidecar(), "resources": {"requests": {"memory": "2Gi"}}}
    source.fail(job_pod(containers=[trainer("1536Mi", "3Gi"), no_limit]))
    containers = [trainer("1Gi", "2Gi"), no_limit]  # the pod: 3Gi requested, 2Gi limit
    verdict, out = mutate(job_pod(containers=containers), attempts=source)
    # 2304Mi / 4608Mi wanted: 4352Mi requested, 4608Mi limit, above the ratio 1.
    assert verdict.allowed and memory(out) == ("1Gi", "2Gi")
    assert any(
        "memory not raised after OOM kills: a LimitRange of namespace ml would refuse the pod" in w
        for w in verdict.warnings
    ), verdict.warnings


def test_unknown_limitranges_leave_the_memory_as_it_is_with_a_warning():
    source = Source(limit_ranges=None)
    source.fail(job_pod())
    verdict, out = mutate(job_pod(), attempts=source)
    assert memory(out) == ("2Gi", "2Gi")
    assert (
        "retry-policy: memory not raised after OOM kills: the LimitRanges of namespace ml are "
        "unknown (LimitRanges unreadable: HTTP 403)"
    ) in verdict.warnings
    assert fields(out)[0]["matchFields"]  # node avoidance does not depend on them


def test_a_workload_is_told_when_its_limit_is_above_a_limitrange():
    ranges = [
        limit_range(container_limits("6Gi")),
        limit_range({"type": "Pod", "max": {"memory": "7Gi"}}),
    ]
    verdict, _ = mutate(job(FACTOR, containers=[trainer()]), attempts=Source(limit_ranges=ranges))
    assert verdict.allowed
    assert (
        "retry-policy: oom-memory-limit 8Gi is above LimitRange ml/mem's container max 6Gi: "
        "memory raises stop there"
    ) in verdict.warnings
    assert any("pod max 7Gi" in w for w in verdict.warnings)
    verdict, _ = mutate(job(FACTOR, containers=[trainer()]), attempts=Source())
    assert not any("LimitRange" in w for w in verdict.warnings)


@pytest.mark.parametrize("kind", ["requests", "limits"])
def test_pod_level_memory_is_denied_with_the_reason(kind):
    pod_level = {"resources": {kind: {"memory": "4Gi"}}}
    obj = job(
        FACTOR,
        containers=[trainer()],
        spec={
            "template": {"spec": {"restartPolicy": "Never", "containers": [trainer()], **pod_level}}
        },
    )
    message = denied(mutate(obj)[0])
    assert (
        f"annotation {P}oom-memory-factor: spec.template.spec.resources sets pod-level memory "
        "(4Gi), which the pod's containers share"
    ) in message
    assert "accepted: memory set on the containers only" in message
    config = parse_config("defaults:\n  oom-memory-factor: 1.5\n  oom-memory-limit: 8Gi\n")
    verdict, out = mutate(job(containers=[trainer()], spec=obj["spec"]), config)
    assert verdict.allowed and any(
        "oom-memory-factor (cluster default) skipped" in w for w in verdict.warnings
    )
    # A controller's pod: admitted as it is, with the reason; a bare pod: denied.
    source = Source()
    source.fail(job_pod(spec=pod_level))
    verdict, out = mutate(job_pod(spec=pod_level), attempts=source)
    assert verdict.allowed and memory(out) == ("2Gi", "2Gi")
    assert any(
        "not applied to this pod" in w and "spec.resources sets pod-level" in w
        for w in verdict.warnings
    )
    bare = pod(FACTOR, spec={"containers": [trainer()], **pod_level})
    assert "spec.resources sets pod-level memory" in denied(mutate(bare, attempts=source)[0])


@pytest.mark.parametrize(
    ("reason", "status_reason", "deleting", "counted"),
    [
        # upstream: addConditionAndDeletePod (pkg/controller/tainteviction): the taint
        # manager deletes the pods of a node tainted NoExecute (unreachable, not ready).
        ("DeletionByTaintManager", None, True, True),
        # upstream: gcOrphaned (pkg/controller/podgc/gc_controller.go): the node is gone.
        ("DeletionByPodGC", None, True, True),
        # upstream: the kubelet's eviction manager (node pressure) and node shutdown.
        ("TerminationByKubelet", "Evicted", False, True),
        ("TerminationByKubelet", "Terminated", False, True),
        # upstream: evictPodsToFreeRequests (pkg/kubelet/preemption): room for a critical pod.
        ("TerminationByKubelet", "Preempting", False, False),
        # upstream: PodReasonPreemptionByScheduler (k8s.io/api core/v1 types.go).
        ("PreemptionByScheduler", None, True, False),
        # The Eviction API (a drain, a person).
        ("EvictionByEvictionAPI", None, True, False),
        (None, None, True, False),  # deleted (its Job, its JobSet's restart)
        (None, None, False, True),  # an ordinary failure
    ],
)
def test_which_disruptions_count_the_node_as_failed(reason, status_reason, deleting, counted):
    source = Source()
    status = {}
    if reason:
        status["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": reason}]
    if status_reason:
        status["reason"] = status_reason
    source.fail(job_pod(), node="node-x", deleting=deleting, **status)
    _, out = mutate(job_pod(), attempts=source)
    assert ("affinity" in out["spec"]) is counted
    assert memory(out) == ("3Gi", "3Gi")  # an OOM kill counts either way


def preferred(obj):
    affinity = obj["spec"].get("affinity") or {}
    return (affinity.get("nodeAffinity") or {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution", []
    )


def gpu_pool(*names, label="gpu"):
    return [node(n, {"pool": label}) for n in names]


@pytest.mark.parametrize("version", ["1.35", "1.36", "1.37"])
def test_failed_nodes_are_required_off_while_another_node_remains(tmp_path, version):
    spec = {"nodeSelector": {"pool": "gpu"}}
    source = Source(nodes=[*gpu_pool("g1", "g2"), node("c1", {"pool": "cpu"})])
    source.fail(job_pod(AVOID, spec=spec), node="g1")
    new = job_pod(AVOID, spec=spec)
    verdict, out = mutate(new, attempts=source)
    assert [r["values"] for r in fields(out)[0]["matchFields"]] == [["g1"]]
    assert preferred(out) == []
    assert "retry-policy: keeping off 1 node(s) where earlier attempts failed: g1" in (
        verdict.warnings
    )
    validate_schema(out, version)
    assert kubectl_patch(new, verdict.patch, tmp_path) == out


@pytest.mark.parametrize("version", ["1.35", "1.36", "1.37"])
def test_when_only_failed_nodes_remain_they_are_avoided_by_preference(tmp_path, version):
    """g2 is the only other gpu node and it is cordoned: a requirement would leave the
    pod Pending until the Job's deadline; a preference lets it run on g1 if it must."""
    # upstream: RequiredNodeAffinity.Match (k8s.io/component-helpers scheduling/corev1/
    # nodeaffinity); NodeUnschedulable filter: a cordoned node takes only pods that
    # tolerate node.kubernetes.io/unschedulable:NoSchedule.
    spec = {"nodeSelector": {"pool": "gpu"}}
    nodes = [*gpu_pool("g1"), node("g2", {"pool": "gpu"}, unschedulable=True)]
    source = Source(nodes=[*nodes, node("c1", {"pool": "cpu"})])
    source.fail(job_pod(AVOID, spec=spec), node="g1")
    new = job_pod(AVOID, spec=spec)
    verdict, out = mutate(new, attempts=source)
    assert (
        "requiredDuringSchedulingIgnoredDuringExecution"
        not in out["spec"]["affinity"]["nodeAffinity"]
    )
    assert preferred(out) == [
        {
            "weight": 100,
            "preference": {
                "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["g1"]}]
            },
        }
    ]
    assert (
        "retry-policy: avoiding 1 node(s) where earlier attempts failed by preference only "
        "(no other Ready node fits the pod): g1"
    ) in verdict.warnings
    applied = json.loads(out["metadata"]["annotations"][P + "applied"])
    assert applied["avoidedBy"] == "preference"
    validate_schema(out, version)
    assert kubectl_patch(new, verdict.patch, tmp_path) == out
    again, twice = mutate(out, attempts=source)
    assert again.patch == [] and twice == out
    # The cordoned node tolerated: it remains, so the failed node is required off.
    tolerant = {
        **spec,
        "tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}],
    }
    _, out = mutate(job_pod(AVOID, spec=tolerant), attempts=source)
    assert [r["values"] for r in fields(out)[0]["matchFields"]] == [["g1"]]


def test_taints_not_ready_nodes_and_the_non_spot_requirement_leave_no_node():
    # upstream: FindMatchingUntoleratedTaint with DoNotScheduleTaintsFilterFunc (the
    # scheduler's TaintToleration filter): every NoSchedule and NoExecute taint must be
    # tolerated; PreferNoSchedule is not filtered on.
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    soft = {"key": "busy", "value": "yes", "effect": "PreferNoSchedule"}
    spot = {"cloud.google.com/gke-spot": "true"}
    nodes = [
        node("tainted", taints=[gpu_taint]),
        node("down", ready=False),
        node("spot-1", spot),
        node("regular", taints=[soft]),
    ]
    source = Source(nodes=nodes)
    annotations = {**AVOID, P + "backoff-limit": "1", P + "non-spot-attempts": "1"}
    source.fail(job_pod(annotations), node="regular")
    _, out = mutate(job_pod(annotations), attempts=source)
    # The last attempt must run on a non-spot node; the only one left is the failed one.
    assert preferred(out) and all("matchFields" not in t for t in fields(out))
    tolerated = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}
    _, out = mutate(job_pod(annotations, spec=tolerated), attempts=source)
    assert not preferred(out) and fields(out)[0]["matchFields"][0]["values"] == ["regular"]


def test_unknown_nodes_mean_a_preference_with_the_reason():
    source = Source(nodes=None)
    source.fail(job_pod(AVOID))
    verdict, out = mutate(job_pod(AVOID), attempts=source)
    assert (
        preferred(out)
        and "requiredDuringSchedulingIgnoredDuringExecution"
        not in (out["spec"]["affinity"]["nodeAffinity"])
    )
    assert any("(Nodes unreadable: HTTP 403): node-a" in w for w in verdict.warnings)


# --- the history ----------------------------------------------------------------------------


def key(expected, uid="job-1", lineage=None, index=None, per_index=False):
    return HistoryKey("ml", "train", uid, lineage or uid, index, expected, per_index)


def failed_pod(uid="p1", node="node-a", oom=True, job_uid="job-1", annotations=None):
    return {
        "metadata": {"uid": uid, "namespace": "ml", "annotations": annotations or dict(AVOID)},
        "spec": {"nodeName": node},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "main",
                    "state": {
                        "terminated": {"exitCode": 137, "reason": "OOMKilled" if oom else "Error"}
                    },
                }
            ],
        },
    }


def test_a_pod_is_recorded_once_and_only_when_its_workload_asked():
    h = FailureHistory()
    assert h.record(failed_pod(), "job-1", True)
    assert not h.record(failed_pod(), "job-1", True)  # modified again: the same failure
    assert not h.record(failed_pod("p2", annotations={"x": "y"}), "job-1", True)
    answer = h.lookup(key(1))
    assert answer.oom_kills == (Killed("main", 1),) and answer.nodes == ("node-a",)
    assert answer.failures == 1 and answer.missing == 0


def test_a_pod_seen_again_is_never_counted_twice_however_many_failed():
    """A relist (after a 410, an API server restart, a dropped connection) delivers every
    failed pod again, in any order: none counts twice, for any number of them."""
    h = FailureHistory()
    pods = [failed_pod(f"p{i}", node=f"n{i}") for i in range(200)]
    for made in pods:
        assert h.record(made, "job-1", True)
    before = h.lookup(key(200))
    for made in reversed(pods):
        assert not h.record(made, "job-1", True)
    after = h.lookup(key(200))
    assert after == before
    assert after.oom_kills == (Killed("main", 200),) and after.failures == 200
    assert after.nodes == tuple(f"n{i}" for i in range(184, 200))
    assert h.lookup(key(201)) is None  # one more counted failure is still unseen


def test_the_tally_is_small_json():
    h = FailureHistory()
    made = failed_pod()
    made["spec"]["containers"] = [
        {"name": "main", "resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}}
    ]
    h.record(made, "job-1", True)
    assert json.loads(json.dumps(h.lookup(key(1)).to_json())) == {
        "oomKills": [["main", 1, 2**30, 2**31]],
        "nodes": ["node-a"],
    }


def test_nodes_are_distinct_most_recent_last_and_bounded():
    h = FailureHistory()
    for i, name in enumerate(["a", "b", "a", *[f"n{j}" for j in range(20)]]):
        h.record(failed_pod(f"p{i}", name), "job-1", True)
    nodes = h.lookup(key(0)).nodes
    assert len(nodes) == history.MAX_NODES and nodes[-1] == "n19" and len(set(nodes)) == len(nodes)


def test_a_job_counted_more_failures_than_were_seen_needs_a_list():
    h = FailureHistory()
    assert h.lookup(key(1)) is None
    assert h.fetch(key(1)).reason == "no connection to a cluster"
    h.record(failed_pod(), "job-1", True)
    assert h.lookup(key(1)).known
    # An ignored failure (not counted) does not stand in for a counted one.
    h.record(failed_pod("p2"), "job-1", False)
    assert h.lookup(key(2)) is None


def test_a_deleted_job_takes_its_history_a_jobsets_lineage_stays():
    h = FailureHistory()
    h.record(failed_pod(), "job-1", True)
    set_pod = failed_pod("p9")
    set_pod["metadata"]["labels"] = {
        "jobset.sigs.k8s.io/jobset-uid": "set",
        "jobset.sigs.k8s.io/replicatedjob-name": "w",
        "jobset.sigs.k8s.io/job-index": "0",
    }
    h.record(set_pod, "child", True)
    h.forget_job("job-1", "ml")
    h.forget_job("child", "ml")
    assert h.lookup(key(0)).nodes == ()
    assert h.lookup(key(0, uid="child2", lineage="set/w/0")).nodes == ("node-a",)


def test_the_store_is_bounded_oldest_lineage_first():
    h = FailureHistory(max_lineages=3)
    for i in range(5):
        h.record(failed_pod(f"p{i}"), f"job-{i}", True)
    assert h.stats()["lineages"] == 3 and h.stats()["evicted"] == 2
    assert h.lookup(key(1, uid="job-4")).nodes == ("node-a",)
    # An evicted Job's failures are unseen again: listed, never taken for none.
    assert h.lookup(key(1, uid="job-0")) is None


# --- explain -----------------------------------------------------------------------------


def explained(obj, events=None):
    from webhook import cli, explain
    from webhook.policy.config import Config

    prepared, _ = cli.prepare(obj, None)
    parsed = explain.parse_events(events) if events is not None else None
    return explain.explain(prepared, Config(), None, parsed)


def manifest(annotations, containers=None, **spec):
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "annotations": annotations},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": containers or [trainer(), sidecar()],
                }
            },
            **spec,
        },
    }


def test_the_cli_denies_pod_level_memory_and_warns_of_non_137_oom_kills(tmp_path):
    """Through ``retry-webhook dry-run`` as installed: the same engine, the same answers."""
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    from webhook.plan.failureaware import OOM_SIGNAL

    binary = Path(sys.executable).parent / "retry-webhook"
    pod_level = manifest({**FACTOR, P + "fail-non-retriable": "true"})
    pod_level["spec"]["template"]["spec"]["resources"] = {"limits": {"memory": "4Gi"}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(pod_level))
    argv = [str(binary), "dry-run", "-f", str(path)]
    denied_run = subprocess.run(
        argv, capture_output=True, text=True, timeout=scaled(60), check=False
    )
    assert denied_run.returncode != 0
    assert "spec.template.spec.resources sets pod-level memory (4Gi)" in denied_run.stderr
    del pod_level["spec"]["template"]["spec"]["resources"]
    path.write_text(yaml.safe_dump(pod_level))
    allowed = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(60), check=False)
    assert allowed.returncode == 0, allowed.stderr
    assert f"Change: {OOM_SIGNAL}" in allowed.stderr.splitlines()  # said with its rule


def test_oom_events_name_their_container_either_way_round():
    from webhook import explain

    a, b, c = explain.parse_events("oom:trainer,trainer:oom,143+oom:logger")
    assert (a.container, a.exit_code, a.ooms) == ("trainer", 137, ("trainer",))
    assert (b.container, b.exit_code, b.ooms) == ("trainer", 137, ("trainer",))
    assert c.exit_code == 143 and c.others == (("logger", 137),) and c.ooms == ("logger",)
    assert explain.parse_events("oom")[0].oom_killed("main") == ["main"]
    with pytest.raises(explain.ExplainError, match="container:oom or oom:container"):
        explain.parse_events("oom:")


def test_explain_shows_the_memory_each_attempt_gets_as_the_pod_webhook_gives_it():
    (item,) = explained(manifest({**FACTOR, P + "backoff-limit": "5"}))
    rows = [(r.container, r.kills, r.request, r.limit, r.last) for r in item.memory.rows]
    assert rows == [
        ("trainer", 0, "2Gi", "2Gi", False),
        ("trainer", 1, "3Gi", "3Gi", False),
        ("trainer", 2, "4608Mi", "4608Mi", False),
        ("trainer", 3, "6912Mi", "6912Mi", False),
        ("trainer", 4, "8Gi", "8Gi", True),
        ("logger", 0, "64Mi", "-", False),
        ("logger", 1, "96Mi", "-", False),
        ("logger", 2, "144Mi", "-", False),
        ("logger", 3, "216Mi", "-", False),
        ("logger", 4, "324Mi", "-", False),
        ("logger", 5, "486Mi", "-", False),
        ("logger", 6, "729Mi", "-", False),
        ("logger", 7, "1094Mi", "-", False),
        ("logger", 8, "1641Mi", "-", False),
    ]
    # The same figures as the pod webhook's, after that many OOM kills.
    source = Source()
    out = job_pod()
    for kills in (1, 2, 3):
        source.fail(out, oom=("trainer", "logger"))  # each attempt killed at what it got
        _, out = mutate(job_pod(), attempts=source)
        assert memory(out) == (rows[kills][2], rows[kills][3])
        assert memory(out, "logger")[0] == rows[5 + kills][2]
    from webhook import explain

    text = explain.render_text([item])
    assert "Memory after OOM kills (oom-memory-factor 1.5, at most 8Gi)" in text
    assert "                      4 or more   8Gi         8Gi" in text
    data = explain.to_json([item])["items"][0]["memory"]
    assert data["factor"] == "1.5" and data["rows"][1] == {
        "container": "trainer",
        "kills": 1,
        "request": "3Gi",
        "limit": "3Gi",
        "last": False,
    }
    assert [s.name for s in item.settings][-3:] == list(
        ("oom-memory-factor", "oom-memory-limit", "avoid-failed-nodes")
    )


def test_simulate_gives_the_next_attempt_the_memory_of_its_oom_kills():
    (item,) = explained(manifest({**FACTOR, P + "backoff-limit": "5"}), "oom:trainer,1,oom")
    results = [step.result for step in item.simulation.steps]
    assert results[0].endswith("next: attempt 2, on any node, with trainer's memory 3Gi/3Gi")
    assert "memory" not in results[1]  # exit code 1: no OOM kill
    assert results[2].endswith("with trainer's memory 4608Mi/4608Mi")


def test_a_jobsets_runs_keep_their_oom_kills_in_the_simulation():
    obj = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "llm", "annotations": {**FACTOR, P + "backoff-limit": "3"}},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "template": {
                                "spec": {"restartPolicy": "Never", "containers": [trainer()]}
                            }
                        }
                    },
                }
            ]
        },
    }
    _, child = explained(obj, "oom,oom")
    results = [step.result for step in child.simulation.steps]
    assert "trainer's memory 3Gi/3Gi" in results[0] and "run 2" in results[0]
    assert "trainer's memory 4608Mi/4608Mi" in results[1] and "run 3" in results[1]
    assert child.memory.rows[1].request == "3Gi"


def test_the_last_failure_of_a_lineage_is_told_in_a_fixed_grammar():
    """``failure_cause``: disruption first, then an OOM kill, then the first container
    that exited non-zero (regular before init, as ``matchOnExitCodes`` reads them)."""

    def failed(statuses, conditions=(), init=()):
        return {
            "status": {
                "phase": "Failed",
                "conditions": list(conditions),
                "containerStatuses": statuses,
                "initContainerStatuses": list(init),
            }
        }

    def term(name, code, at, reason="Error"):
        state = {"exitCode": code, "reason": reason, "finishedAt": at}
        return {"name": name, "state": {"terminated": state}}

    t1, t2 = "2026-11-26T10:00:00Z", "2026-11-26T10:05:00Z"
    # the time: the last container to finish (a sidecar stopped after the main one)
    assert history.failure_cause(failed([term("main", 42, t1), term("side", 0, t2)])) == (
        "exit-code:42:main",
        history.parse_time(t2),
    )
    cause, when = history.failure_cause(
        failed([term("main", 1, t1), term("side", 137, t2, "OOMKilled")])
    )
    assert cause == "oom-killed:side" and when == history.parse_time(t2)
    disrupted = failed(
        [term("main", 143, t1)],
        [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
    )
    assert history.failure_cause(disrupted) == ("disruption", history.parse_time(t1))
    assert history.failure_cause(failed([], init=[term("setup", 2, t1)]))[0] == (
        "exit-code:2:setup"
    )
    assert history.failure_cause(failed([])) == ("", None)
    h = FailureHistory()
    late = failed_pod("p2")
    late["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = t2
    early = failed_pod("p1", oom=False)
    early["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = t1
    h.record(late, "job-1", True)
    h.record(early, "job-1", True)  # seen later, failed earlier: not the last
    answer = h.lookup(key(2))
    assert answer.last_cause == "oom-killed:main" and answer.last_failed_at == history.parse_time(
        t2
    )


def test_the_cli_warns_of_a_limitrange_given_in_its_input(tmp_path):
    """``dry-run`` reads LimitRanges from its input, as it reads Trainer runtimes: a
    workload whose oom-memory-limit is above its namespace's container max is told (the
    server does the same from its watch of LimitRanges)."""
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    binary = Path(sys.executable).parent / "retry-webhook"
    limit_range = {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "caps", "namespace": "ml"},
        "spec": {"limits": [{"type": "Container", "max": {"memory": "4Gi"}}]},
    }
    job_ = manifest(FACTOR)
    job_["metadata"]["namespace"] = "ml"
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump_all([limit_range, job_]))
    argv = [str(binary), "dry-run", "-f", str(path), "-o", "name"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(60), check=False)
    assert done.returncode == 0, done.stderr
    warning = "oom-memory-limit 8Gi is above LimitRange ml/caps's container max 4Gi"
    assert warning in done.stderr
    limit_range["metadata"]["namespace"] = "other"  # another namespace's: not ours
    path.write_text(yaml.safe_dump_all([limit_range, job_]))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(60), check=False)
    assert done.returncode == 0 and "LimitRange" not in done.stderr
