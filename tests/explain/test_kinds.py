"""``retry-webhook explain`` for CronJob, JobSet, RayJob and PyTorchJob: provenance, rules
in words, plan rows at their boundaries (checked against the real pod webhook), every
simulated outcome per kind, JSON that agrees with the text, 80 columns, and the installed
CLI on every shipped example."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testkit.builders import FULL, P, job_owner, pod, review
from testkit.cli import run
from testkit.explain import assert_text_and_json_agree, doc_block, explained, rows, setting
from testkit.servers import scaled
from testkit.tools import ROOT
from webhook import cli, explain
from webhook.admission import engine
from webhook.admission import review as admission
from webhook.kinds.jobset.explain import describe_job_failure
from webhook.kinds.jobset.simulate import jobset_rule_matches
from webhook.plan.explained import AttemptGap
from webhook.policy.config import Config, parse_config

BIN = Path(sys.executable).parent / "retry-webhook"
EXAMPLES = ROOT / "examples"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"


def pod_spec(*names, restart_policy="Never"):
    spec = {"containers": [{"name": n, "image": "ghcr.io/example/train:1.0.0"} for n in names]}
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    return spec


def manifest(api_version, kind, spec, annotations=None, name="train"):
    """An object as a user writes it (explain prepares it as the API server would)."""
    obj = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": "ml"},
        "spec": copy.deepcopy(spec),
    }
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)
    return obj


def items(obj, config=None, events=None):
    result = explained(obj, config, events)
    assert isinstance(result, list), result
    return result


def by_part(obj, config=None, events=None):
    return {item.part: item for item in items(obj, config, events)}


def example(name):
    return yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())


def reviewed(obj, config=None):
    prepared, _ = cli.prepare(obj, None)
    return engine.review(prepared, config or Config())


def placed_by_pod_webhook(template, labels=None, annotations=None):
    """Whether the real pod webhook sends a pod made from ``template`` to non-spot nodes."""
    meta = dict((template.get("metadata") or {}).get("annotations") or {})
    obj = pod(meta | (annotations or {}), owner=job_owner(), spec=copy.deepcopy(template["spec"]))
    if labels:
        obj["metadata"]["labels"] = dict(labels)
    verdict = engine.mutate(admission.decode(json.dumps(review(obj))), Config())
    assert verdict.allowed, verdict.message
    return any(op["path"].startswith("/spec/affinity") for op in verdict.patch)


# --- batch/v1 CronJob ----------------------------------------------------------------------


def cronjob(annotations=None, *, template_annotations=None, **job_spec):
    template = {"spec": {**job_spec, "template": {"spec": pod_spec("eval")}}}
    if template_annotations:
        template["metadata"] = {"annotations": dict(template_annotations)}
    spec = {"schedule": "0 3 * * *", "jobTemplate": template}
    return manifest("batch/v1", "CronJob", spec, annotations, name="nightly")


def test_cronjob_explains_each_job_it_creates():
    (item,) = items(cronjob(FULL))
    assert (item.kind, item.part, item.owner) == ("CronJob", "each Job it creates", "Job")
    assert setting(item, "backoff-limit").text == "your annotation"
    assert item.attempts.limit_field == "spec.jobTemplate.spec.backoffLimit"
    assert [r.failures_before for r in rows(item.attempts)] == [0, 1, 2, 3]
    assert [r.origin for r in item.rules] == [
        "added by retry-policy for ignore-disruptions",
        "added by retry-policy for fail-non-retriable",
    ]
    assert any("next Job starts again at attempt 1" in note for note in item.notes)
    assert set(reviewed(cronjob(FULL)).outcome.policies) == {"spec.jobTemplate.spec"}


def test_cronjob_provenance_of_the_template_budget():
    # Annotations on the jobTemplate count as the CronJob's own.
    (item,) = items(cronjob(template_annotations={P + "backoff-limit": "4"}))
    assert (setting(item, "backoff-limit").value, setting(item, "backoff-limit").text) == (
        "4",
        "your annotation",
    )
    # A template is not API-defaulted: a 6 in it was written, an absent one is the default.
    (written,) = items(cronjob(backoffLimit=6))
    assert setting(written, "backoff-limit").text == "your own spec.jobTemplate.spec.backoffLimit"
    (plain,) = items(cronjob())
    assert (setting(plain, "backoff-limit").value, setting(plain, "backoff-limit").text) == (
        "6",
        "Kubernetes default",
    )
    config = parse_config("defaults: {backoff-limit: 2}")
    (default,) = items(cronjob(), config)
    assert setting(default, "backoff-limit").text == "cluster default"
    assert default.attempts.limit == 2


@pytest.mark.parametrize(("backoff", "n"), [(3, 1), (2, 3), (0, 1)])
def test_cronjob_plan_agrees_with_the_pod_webhook(backoff, n):
    obj = cronjob({P + "backoff-limit": str(backoff), P + "non-spot-attempts": str(n)})
    template = reviewed(obj).result["spec"]["jobTemplate"]["spec"]["template"]
    (item,) = items(obj)
    placements = [r.nodes == "non-spot only" for r in rows(item.attempts)]
    assert placements == [a >= backoff + 1 - n for a in range(backoff + 1)]
    for row in rows(item.attempts):
        attempt = {P + "attempt": str(row.failures_before)}
        assert placed_by_pod_webhook(template, annotations=attempt) is (row.nodes != "any node")


@pytest.mark.parametrize(
    ("events", "state", "reason"),
    [
        ("1", "Failed", "PodFailurePolicy"),
        ("143,143,143,143", "Failed", "BackoffLimitExceeded"),
        ("143,disruption,143", "Running", None),
    ],
)
def test_cronjob_simulates_its_jobs(events, state, reason):
    (item,) = items(cronjob(FULL), events=events)
    assert (item.simulation.ending.state, item.simulation.ending.reason) == (state, reason)
    text = " ".join(explain.render_text([item]).split())
    if state == "Failed":
        assert f"Outcome: the Job fails; condition Failed, reason {reason}" in text
    else:
        assert "Outcome: the Job is still running; attempt 3 runs next" in text


# --- jobset.x-k8s.io/v1alpha2 JobSet -------------------------------------------------------


def replicated(name, replicas=1, restart_policy="Never", containers=("trainer",), **job_spec):
    return {
        "name": name,
        "replicas": replicas,
        "template": {
            "spec": {
                "parallelism": 1,
                "completions": 1,
                **job_spec,
                "template": {"spec": pod_spec(*containers, restart_policy=restart_policy)},
            }
        },
    }


def jobset(annotations=None, *, jobs=None, failure_policy=None, name="pretrain"):
    spec = {"replicatedJobs": jobs or [replicated("leader"), replicated("workers", 4)]}
    if failure_policy is not None:
        spec["failurePolicy"] = failure_policy
    return manifest("jobset.x-k8s.io/v1alpha2", "JobSet", spec, annotations, name=name)


def test_jobset_overview_and_one_explanation_per_replicated_job():
    parts = by_part(example("jobset"))
    assert list(parts) == ["", "replicatedJob leader", "replicatedJob workers"]
    overview = parts[""]
    assert overview.attempts is None and overview.simulator is None
    assert setting(overview, "backoff-limit").text == "your annotation"
    assert overview.budget.startswith(
        "maxRestarts is 3 (from your annotation retry-policy.dev/backoff-limit): when one of "
        "its Jobs fails, JobSet restarts the whole set"
    )
    assert "so the set gets up to 4 runs" in overview.budget
    assert "each Job retries its own pods up to its backoffLimit: leader 0, workers 0" in (
        " ".join(overview.budget.split())
    )
    # The changes are listed once, with the JobSet.
    assert overview.changes and parts["replicatedJob leader"].changes == []
    keys = set(reviewed(example("jobset")).outcome.policies)
    assert keys == {
        "spec",
        "spec.replicatedJobs[0].template.spec",
        "spec.replicatedJobs[1].template.spec",
    }


def test_jobset_rules_in_words_in_order_with_their_origin():
    overview = by_part(example("jobset"))[""]
    assert [(r.number, r.action, r.when, r.then, r.origin) for r in overview.rules] == [
        (
            1,
            "RestartJobSetAndIgnoreMaxRestarts",
            "the controller fails a disrupted pod's Job (peer-disruptions: FailureTarget, "
            "reason PodFailurePolicy, message retry-policy.dev/PeerDisrupted: ...); the peers "
            "stop with the restart",
            "the JobSet restarts, does not count",
            "added by retry-policy for peer-disruptions (retryPolicyPeerDisruptions)",
        ),
        (
            2,
            "FailJobSet",
            "a Job fails with reason DeadlineExceeded (it ran longer than its "
            "activeDeadlineSeconds)",
            "the JobSet fails at once",
            "your rule failOnDeadline",
        ),
        (
            3,
            "FailJobSet",
            "a Job fails with reason PodFailurePolicy (a FailJob rule of its podFailurePolicy "
            "matched)",
            "the JobSet fails at once",
            "added by retry-policy for fail-non-retriable (retryPolicyFailNonRetriable)",
        ),
    ]
    assert overview.rules_intro.startswith("When one of its Jobs fails, JobSet checks")
    assert overview.no_match == (
        "anything else (no rule matches): the JobSet restarts (RestartJobSet), counts "
        "against maxRestarts"
    )
    leader = by_part(example("jobset"))["replicatedJob leader"]
    assert [r.origin for r in leader.rules] == [
        "added by retry-policy for peer-disruptions",
        "added by retry-policy for ignore-disruptions",
        "added by retry-policy for fail-non-retriable",
    ]


def test_jobset_rule_conditions_in_words():
    rule = {
        "action": "RestartJobSetAndIgnoreMaxRestarts",
        "onJobFailureReasons": ["BackoffLimitExceeded", "DeadlineExceeded"],
        "onJobFailureMessagePatterns": ["node .* not ready"],
        "targetReplicatedJobs": ["leader", "workers"],
    }
    assert describe_job_failure(rule) == (
        "a Job of leader or workers fails with reason BackoffLimitExceeded or "
        "DeadlineExceeded, its failure message matching /node .* not ready/"
    )
    assert describe_job_failure({"action": "FailJobSet"}) == "a Job fails"
    obj = jobset(
        {P + "backoff-limit": "2"},
        failure_policy={"rules": [rule | {"name": "flaky"}, {"action": "RestartJob"}]},
    )
    overview = by_part(obj)[""]
    assert [(r.then, r.origin, r.counts) for r in overview.rules] == [
        ("the JobSet restarts, does not count", "your rule flaky", False),
        (
            "only that Job is recreated, counts against maxRestarts",
            "your rule failurePolicyRule1",
            True,
        ),
    ]


def test_jobset_rule_matching_is_jobsets():
    rule = {
        "onJobFailureReasons": ["PodFailurePolicy"],
        "onJobFailureMessagePatterns": ["exit code 42 "],
        "targetReplicatedJobs": ["workers"],
    }
    message = (
        "Container trainer for pod ml/w-0 failed with exit code 42 matching FailJob rule at index 0"
    )
    assert jobset_rule_matches(rule, "PodFailurePolicy", message, "workers")
    assert not jobset_rule_matches(rule, "BackoffLimitExceeded", message, "workers")
    assert not jobset_rule_matches(rule, "PodFailurePolicy", message, "leader")
    assert not jobset_rule_matches(rule, "PodFailurePolicy", message.replace("42", "4"), "workers")
    assert not jobset_rule_matches(rule | {"onJobFailureMessagePatterns": ["("]}, "", "", "")
    assert jobset_rule_matches({}, "DeadlineExceeded", "", "leader")


def test_jobset_provenance():
    config = parse_config("defaults: {backoff-limit: 5}")
    obj = jobset(failure_policy={"maxRestarts": 2})
    overview, leader = items(obj, config)[:2]
    assert (setting(overview, "backoff-limit").value, setting(overview, "backoff-limit").text) == (
        "2",
        "your own spec.failurePolicy.maxRestarts",
    )
    assert leader.budget.startswith("backoffLimit is 6 (from the Kubernetes default)")
    # The child's 0 is set by the webhook because backoff-limit counts runs of the set.
    leader = items(jobset({P + "backoff-limit": "3"}))[1]
    assert leader.budget.startswith(
        "backoffLimit is 0 (set by retry-policy: backoff-limit counts runs of the JobSet"
    )
    # A child budget the user wrote stays theirs.
    written = jobset({P + "backoff-limit": "3"}, jobs=[replicated("w", backoffLimit=2)])
    assert items(written)[1].budget.startswith(
        "backoffLimit is 2 (from your own spec.replicatedJobs[0].template.spec.backoffLimit)"
    )
    plain = items(jobset())[0]
    assert (setting(plain, "backoff-limit").value, setting(plain, "backoff-limit").text) == (
        "0",
        "JobSet default",
    )
    assert plain.budget.startswith("This JobSet has no spec.failurePolicy")


@pytest.mark.parametrize(
    ("backoff", "n", "child"),
    [(3, 1, None), (3, 4, None), (2, 2, None), (0, 1, None), (3, 3, 1), (4, 5, 2)],
)
def test_jobset_run_plan_agrees_with_the_pod_webhook(backoff, n, child):
    """Each run row's placement is what the real pod webhook does to a pod of that run
    (its restart-attempt label), for every replicated Job."""
    extra = {"backoffLimit": child} if child is not None else {}
    obj = jobset(
        {P + "backoff-limit": str(backoff), P + "non-spot-attempts": str(n)},
        jobs=[replicated("leader", **extra), replicated("workers", 4, **extra)],
    )
    final = reviewed(obj).result
    per_run = (child or 0) + 1
    runs_non_spot = -(-n // per_run)  # the last runs that hold the last n attempts
    for index, item in enumerate(items(obj)[1:]):
        assert item.attempts.unit == "run"
        assert item.attempts.limit_field == "spec.failurePolicy.maxRestarts"
        plan = rows(item.attempts)
        assert [r.failures_before for r in plan] == list(range(backoff + 1))
        assert [r.nodes == "non-spot only" for r in plan] == [
            a >= backoff + 1 - runs_non_spot for a in range(backoff + 1)
        ]
        assert plan[-1].if_fails == "the JobSet fails (ReachedMaxRestarts)"
        template = final["spec"]["replicatedJobs"][index]["template"]["spec"]["template"]
        for row in plan:
            labels = {RESTART_ATTEMPT: str(row.failures_before)}
            assert placed_by_pod_webhook(template, labels=labels) is (row.nodes != "any node")


def jobset_sim(obj, events, part="replicatedJob leader", config=None):
    return by_part(obj, config, events)[part].simulation


def test_jobset_simulate_fail_jobset_on_a_non_retriable_exit():
    sim = jobset_sim(example("jobset"), "137,1")
    assert [(s.run, s.restarts, s.counted_failures) for s in sim.steps] == [(1, 1, 1), (2, 1, 1)]
    assert (sim.ending.state, sim.ending.reason) == ("Failed", "FailJobSetFailurePolicyAction")
    assert sim.ending.message == (
        "a Job of leader failed with reason PodFailurePolicy, and rule 3 "
        "retryPolicyFailNonRetriable says so"
    )
    assert "JobSet rule 3 retryPolicyFailNonRetriable (FailJobSet)" in sim.steps[1].result


def test_jobset_simulate_reached_max_restarts_and_placement_by_run():
    sim = jobset_sim(example("jobset"), "143,143,143,143,1")
    assert (sim.ending.state, sim.ending.reason) == ("Failed", "ReachedMaxRestarts")
    assert [s.run for s in sim.steps] == [1, 2, 3, 4]
    assert [s.restarts for s in sim.steps] == [1, 2, 3, 3]
    assert [s.counted_failures for s in sim.steps] == [1, 2, 3, 3]
    assert [s.nodes for s in sim.steps] == ["any node"] * 3 + ["non-spot only"]
    assert sim.unused == ["1"]
    assert "3 of 3 restarts used, the JobSet fails" in sim.steps[-1].result
    running = jobset_sim(example("jobset"), "143,143,143")
    assert running.ending.state == "Running"
    assert running.ending.message == (
        "run 4 goes on (restart-attempt 3), on non-spot nodes only; the next Job to fail "
        "by a counted restart ends it"
    )


def test_jobset_simulate_ignored_disruptions_restart_the_set_uncounted():
    """peer-disruptions ignore: the controller fails each disrupted pod's Job, and the
    set restarts on retryPolicyPeerDisruptions without counting against maxRestarts
    (restart-attempt still rises)."""
    sim = jobset_sim(example("jobset"), ",".join(["disruption"] * 12))
    assert sim.ending.state == "Running"
    assert [(s.run, s.counted, s.restarts, s.counted_failures) for s in sim.steps] == [
        (n, False, n, 0) for n in range(1, 13)
    ]
    assert "JobSet rule 1 retryPolicyPeerDisruptions" in sim.steps[0].result
    assert sim.ending.message.endswith("3 more restarts can count before the JobSet fails")
    # Without peer-disruptions, an ignored disruption stays in the run.
    plain = example("jobset")
    del plain["metadata"]["annotations"][P + "peer-disruptions"]
    sim = jobset_sim(plain, ",".join(["disruption"] * 12))
    assert {(s.run, s.counted, s.restarts) for s in sim.steps} == {(1, False, 0)}


def test_jobset_simulate_restarts_that_ignore_max_restarts():
    """Disruptions fail the Job (the user's FailJob rule), and the user's JobSet rule restarts
    without counting: restart-attempt still rises, so placement runs ahead, never late."""
    child = {
        "backoffLimit": 0,
        "podFailurePolicy": {
            "rules": [{"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}]
        },
    }
    obj = jobset(
        {P + "backoff-limit": "1", P + "non-spot-attempts": "1"},
        jobs=[replicated("leader", **child)],
        failure_policy={
            "maxRestarts": 1,
            "rules": [
                {
                    "name": "preempted",
                    "action": "RestartJobSetAndIgnoreMaxRestarts",
                    "onJobFailureReasons": ["PodFailurePolicy"],
                }
            ],
        },
    )
    sim = jobset_sim(obj, "disruption,disruption,143,143")
    assert [s.restarts for s in sim.steps] == [1, 2, 3, 3]
    assert [s.counted_failures for s in sim.steps] == [0, 0, 1, 1]
    # restart-attempt 1 and on: the last run of maxRestarts 1 (early for ignored restarts)
    assert [s.nodes for s in sim.steps] == ["any node"] + ["non-spot only"] * 3
    assert "not counted, still 0 of 1 restarts used" in sim.steps[0].result
    assert (sim.ending.state, sim.ending.reason) == ("Failed", "ReachedMaxRestarts")


def test_jobset_simulate_message_patterns_tell_exit_codes_apart():
    child = {
        "backoffLimit": 0,
        "podFailurePolicy": {
            "rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [1, 42]}}]
        },
    }
    rules = [
        {
            "name": "exit42",
            "action": "FailJobSet",
            "onJobFailureReasons": ["PodFailurePolicy"],
            "onJobFailureMessagePatterns": ["exit code 42 "],
        }
    ]
    obj = jobset(
        jobs=[replicated("leader", **child)], failure_policy={"maxRestarts": 2, "rules": rules}
    )
    sim = jobset_sim(obj, "1,42")
    assert "no JobSet rule matches (RestartJobSet): the JobSet restarts" in sim.steps[0].result
    assert (sim.ending.state, sim.ending.reason) == ("Failed", "FailJobSetFailurePolicyAction")
    assert "JobSet rule 1 exit42 (FailJobSet)" in sim.steps[1].result


def test_failjob_messages_are_the_job_controllers():
    """The Job condition messages JobSet patterns are matched against, in the format of
    the Job controller's matchPodFailurePolicy (the pod is not known offline)."""
    from webhook.kube.failurepolicy import ContainerExit, Match

    exit_match = Match(1, "FailJob", {}, container=ContainerExit("main", 42))
    assert explain.failjob_message(exit_match) == (
        "Container main for pod <namespace>/<pod> failed with exit code 42 matching FailJob "
        "rule at index 1"
    )
    condition = Match(0, "FailJob", {}, condition="DisruptionTarget")
    assert explain.failjob_message(condition) == (
        "Pod <namespace>/<pod> has condition DisruptionTarget matching FailJob rule at index 0"
    )


def test_jobset_simulate_target_replicated_jobs():
    rules = [{"name": "leaderDown", "action": "FailJobSet", "targetReplicatedJobs": ["leader"]}]
    jobs = [replicated("leader", backoffLimit=0), replicated("workers", 4, backoffLimit=0)]
    parts = by_part(
        jobset(jobs=jobs, failure_policy={"maxRestarts": 1, "rules": rules}), None, "143"
    )
    assert parts["replicatedJob leader"].simulation.ending.reason == "FailJobSetFailurePolicyAction"
    workers = parts["replicatedJob workers"].simulation
    assert workers.ending.state == "Running"
    assert workers.steps[0].restarts == 1


def test_jobset_simulate_without_a_failure_policy():
    jobs = [replicated("leader", backoffLimit=1)]
    sim = jobset_sim(jobset(jobs=jobs), "143")
    assert sim.ending.state == "Running"
    assert "next: attempt 2, in run 1, on any node" in sim.steps[0].result
    sim = jobset_sim(jobset(jobs=jobs), "143,143")
    assert (sim.ending.state, sim.ending.reason) == ("Failed", "FailedJobs")
    assert sim.ending.message == (
        "a Job of leader failed with reason BackoffLimitExceeded, and there is no failurePolicy"
    )


def test_jobset_simulate_child_retries_inside_a_run():
    jobs = [replicated("leader", backoffLimit=1)]
    sim = jobset_sim(jobset({P + "backoff-limit": "2"}, jobs=jobs), "143,143,143")
    assert [(s.run, s.attempt, s.restarts) for s in sim.steps] == [(1, 1, 0), (1, 2, 1), (2, 1, 1)]
    assert sim.ending.state == "Running"


def test_jobset_simulate_restart_job_recreates_one_job():
    rules = [{"name": "one", "action": "RestartJob"}]
    jobs = [replicated("leader", backoffLimit=0)]
    sim = jobset_sim(
        jobset(jobs=jobs, failure_policy={"maxRestarts": 1, "rules": rules}), "143,143"
    )
    assert "only this Job is recreated (1 of 1 restarts used); next: run 1 again" in (
        sim.steps[0].result
    )
    assert [s.restarts for s in sim.steps] == [0, 0]  # restart-attempt does not move
    assert (sim.ending.state, sim.ending.reason) == ("Failed", "ReachedMaxRestarts")


@pytest.mark.parametrize(
    ("max_failed", "job_reason", "reason"),
    [
        (None, "FailedIndexes", "FailJobSetFailurePolicyAction"),
        (0, "MaxFailedIndexesExceeded", "ReachedMaxRestarts"),
    ],
)
def test_jobset_simulate_indexed_child_jobs(max_failed, job_reason, reason):
    """An index that fails fails its Job with FailedIndexes once the others are done (or at
    once with MaxFailedIndexesExceeded), and the JobSet rules see that reason."""
    child = {"completionMode": "Indexed", "completions": 2, "backoffLimitPerIndex": 0}
    if max_failed is not None:
        child["maxFailedIndexes"] = max_failed
    rules = [{"name": "badShard", "action": "FailJobSet", "onJobFailureReasons": ["FailedIndexes"]}]
    obj = jobset(jobs=[replicated("leader", **child)], failure_policy={"rules": rules})
    sim = jobset_sim(obj, "143")
    (step,) = sim.steps
    assert f"the Job fails ({job_reason})" in step.result
    assert (sim.ending.state, sim.ending.reason) == ("Failed", reason)


def test_jobset_restart_policy_defaulted_by_jobset_restarts_in_place():
    jobs = [replicated("leader", restart_policy=None)]
    parts = by_part(jobset(jobs=jobs), None, "1,1,1,1,1,1")
    leader = parts["replicatedJob leader"]
    assert any("JobSet's own webhook sets it to OnFailure" in n for n in leader.notes)
    sim = leader.simulation
    assert {s.pod for s in sim.steps} == {1}
    assert (sim.ending.state, sim.ending.reason) == ("Failed", "FailedJobs")
    assert sim.steps[-1].result.startswith(
        "the container restarts in place (6 restarts): the Job fails (BackoffLimitExceeded); "
        "the JobSet has no failurePolicy: it fails (FailedJobs)"
    )


def test_jobset_examples_walk_the_first_run():
    leader = by_part(example("jobset"))["replicatedJob leader"]
    by_start = {e.split(":")[0]: e for e in leader.examples}
    assert by_start["exit code 1 (application error) in container trainer"].endswith(
        "JobSet rule 3 retryPolicyFailNonRetriable (FailJobSet): the JobSet fails at once"
    )
    assert (
        "the JobSet restarts (1 of 3 restarts used)"
        in by_start["exit code 143 (SIGTERM) in container trainer"]
    )


def test_jobset_simulate_note_and_unknown_container():
    overview = items(example("jobset"), events="143")[0]
    assert any("see each replicated Job below" in note for note in overview.notes)
    with pytest.raises(explain.ExplainError) as caught:
        items(example("jobset"), events="ghost:1")
    # A container of no replicated Job (an event fails the pod of the Job it names).
    assert "'ghost', which no pod of JobSet/llm-pretrain has" in str(caught.value)


# --- ray.io/v1 RayJob ------------------------------------------------------------------------


def rayjob(annotations=None, **spec):
    cluster = {
        "headGroupSpec": {
            "rayStartParams": {},
            "template": {"spec": pod_spec("ray-head", restart_policy=None)},
        },
        "workerGroupSpecs": [
            {
                "groupName": "cpu",
                "minReplicas": 1,
                "maxReplicas": 2,
                "rayStartParams": {},
                "template": {"spec": pod_spec("ray-worker", restart_policy=None)},
            }
        ],
    }
    body = {"entrypoint": "python tune.py", "rayClusterSpec": cluster, **spec}
    return manifest("ray.io/v1", "RayJob", body, annotations, name="tune")


def test_rayjob_provenance_and_budget():
    (item,) = items(rayjob({P + "backoff-limit": "2"}))
    assert [s.name for s in item.settings] == ["backoff-limit", "error-propagation"]
    assert setting(item, "backoff-limit").text == "your annotation"
    assert "so it gets up to 3 attempts; failed attempt number 3 ends it" in item.budget
    assert reviewed(rayjob({P + "backoff-limit": "2"})).outcome.policies["spec"].backoff_limit == 2
    (plain,) = items(rayjob())
    assert (setting(plain, "backoff-limit").value, setting(plain, "backoff-limit").text) == (
        "0",
        "RayJob default",
    )
    assert plain.budget.startswith(
        "backoffLimit is 0 (from the RayJob default): KubeRay does not retry"
    )
    (spec,) = items(rayjob(backoffLimit=1))
    assert setting(spec, "backoff-limit").text == "your own spec.backoffLimit"
    (default,) = items(rayjob(), parse_config("defaults: {backoff-limit: 4}"))
    assert (setting(default, "backoff-limit").value, default.attempts.limit) == ("4", 4)
    assert setting(default, "backoff-limit").text == "cluster default"


def test_rayjob_has_no_rules_and_a_plan_of_attempts():
    (item,) = items(rayjob({P + "backoff-limit": "2"}))
    assert item.rules == []
    assert item.no_match.startswith("a RayJob has no failure rules")
    assert [r.failures_before for r in rows(item.attempts)] == [0, 1, 2]
    assert [r.if_fails for r in rows(item.attempts)] == [
        "retried, 2 retries left",
        "retried, 1 retry left",
        "the RayJob fails (AppFailed)",
    ]


@pytest.mark.parametrize("backoff", [0, 1, 40])
def test_rayjob_plan_rows_at_the_boundaries(backoff):
    obj = rayjob({P + "backoff-limit": str(backoff)})
    (item,) = items(obj)
    plan = rows(item.attempts)
    assert (plan[0].attempt, plan[-1].attempt) == (1, backoff + 1)
    assert plan[-1].if_fails == "the RayJob fails (AppFailed)"
    assert [r.retries_left for r in plan[:-1]] == [backoff - r.failures_before for r in plan[:-1]]
    gaps = [(g.first, g.last) for g in item.attempts.rows if isinstance(g, AttemptGap)]
    assert gaps == ([(4, backoff - 2)] if backoff + 1 > 12 else [])
    # No placement for a RayJob: its pods carry nothing the pod webhook could place them by.
    final = reviewed(obj).result["spec"]["rayClusterSpec"]
    for template in [final["headGroupSpec"]["template"], final["workerGroupSpecs"][0]["template"]]:
        assert {r.nodes for r in plan} == {"any node"}
        assert not placed_by_pod_webhook(template, labels={RESTART_ATTEMPT: str(backoff)})


def test_rayjob_on_an_existing_cluster_is_never_retried():
    obj = rayjob(clusterSelector={"ray.io/cluster": "shared"})
    del obj["spec"]["rayClusterSpec"]
    (item,) = items(obj, events="1")
    assert "which KubeRay cannot recreate" in item.budget
    assert [r.failures_before for r in rows(item.attempts)] == [0]
    assert item.simulation.ending.reason == "AppFailed"


@pytest.mark.parametrize(
    ("events", "state"),
    [("1,143", "Running"), ("1,143,disruption", "Failed"), ("oom,ray-worker:1,2", "Failed")],
)
def test_rayjob_simulate_counts_every_failed_attempt(events, state):
    (item,) = items(rayjob({P + "backoff-limit": "2"}), events=events)
    sim = item.simulation
    assert sim.ending.state == state
    assert [s.counted for s in sim.steps] == [True] * len(sim.steps)
    text = " ".join(explain.render_text([item]).split())
    if state == "Failed":
        assert sim.ending.reason == "AppFailed"
        assert "Outcome: the RayJob fails; jobDeploymentStatus Failed, reason AppFailed" in text
    else:
        assert sim.ending.message == (
            "attempt 3 runs next, on a new RayCluster; its failure, if counted, ends it"
        )
        assert "attempt 2: exit code 143 (SIGTERM) in container ray-head." in text


# --- kubeflow.org/v1 PyTorchJob --------------------------------------------------------------


def pytorchjob(annotations=None, *, restart_policy=None, containers=("pytorch",), **spec):
    replicas = {}
    for rtype, count in (("Master", 1), ("Worker", 3)):
        replicas[rtype] = {
            "replicas": count,
            "template": {"spec": pod_spec(*containers, restart_policy=None)},
        }
        if restart_policy:
            replicas[rtype]["restartPolicy"] = restart_policy
    body = {"pytorchReplicaSpecs": replicas, **spec}
    return manifest("kubeflow.org/v1", "PyTorchJob", body, annotations, name="finetune")


POLICY = {
    P + "fail-non-retriable": "true",
    P + "retriable-exit-codes": "137,143",
}


def test_pytorchjob_provenance_and_rules():
    (item,) = items(pytorchjob(POLICY))
    assert [s.name for s in item.settings] == [
        "backoff-limit",
        "fail-non-retriable",
        "retriable-exit-codes",
        "error-propagation",
    ]
    assert setting(item, "fail-non-retriable").text == "your annotation"
    assert reviewed(pytorchjob(POLICY)).outcome.policies["spec"].backoff_limit is None
    (rule,) = item.rules
    assert (rule.action, rule.when, rule.then, rule.origin) == (
        "ExitCode",
        "exit codes 1-127 in container pytorch (an error of the program, not a signal)",
        "the PyTorchJob fails at once",
        "set by retry-policy for fail-non-retriable",
    )
    assert item.no_match.startswith("anything else (exit codes 128-255, or a pod that failed")
    assert "retries failed pods without limit" in item.budget
    assert item.attempts is None
    (yours,) = items(pytorchjob(restart_policy="ExitCode", runPolicy={"backoffLimit": 1}))
    assert yours.rules[0].origin == "your restartPolicy"
    assert setting(yours, "backoff-limit").text == "your own spec.runPolicy.backoffLimit"
    (plain,) = items(pytorchjob())
    assert (setting(plain, "backoff-limit").value, setting(plain, "backoff-limit").text) == (
        "-",
        "PyTorchJob default",
    )
    assert plain.rules == [] and plain.attempts is None
    assert "(the training operator's default)" in plain.budget
    assert "retries failed pods without limit" in plain.budget


@pytest.mark.parametrize(
    ("obj", "events", "state", "message"),
    [
        (pytorchjob(POLICY), "1", "Failed", "pod 1 matched ExitCode rule 1"),
        (
            pytorchjob(POLICY | {P + "backoff-limit": "0"}),
            "143",
            "Failed",
            "1 counted failure, more than backoffLimit 0",
        ),
        (pytorchjob(POLICY), "143,oom,disruption", "Running", None),
        # upstream: PastBackoffLimit sums restartCount of running pods only; a pod that fails
        # as a whole is recreated (ReconcilePods) and counted only by the NumRequeues check,
        # which holds for a limit of 0 alone.
        (
            pytorchjob(restart_policy="OnFailure", runPolicy={"backoffLimit": 2}),
            "1,disruption,1,disruption,1",
            "Running",
            None,
        ),
        (
            pytorchjob(restart_policy="OnFailure", runPolicy={"backoffLimit": 0}),
            "disruption",
            "Failed",
            "1 failed pod, more than backoffLimit 0",
        ),
        (
            pytorchjob(restart_policy="Never", runPolicy={"backoffLimit": 3}),
            "143",
            "Failed",
            "pod 1 matched Never rule 1",
        ),
        (
            pytorchjob(restart_policy="OnFailure", runPolicy={"backoffLimit": 2}),
            "1,1",
            "Failed",
            "2 restarts reach backoffLimit 2",
        ),
        (
            pytorchjob(restart_policy="OnFailure", runPolicy={"backoffLimit": 2}),
            "1",
            "Running",
            None,
        ),
    ],
)
def test_pytorchjob_simulate(obj, events, state, message):
    (item,) = items(obj, events=events)
    sim = item.simulation
    assert sim.ending.state == state
    if state == "Failed":
        assert (sim.ending.reason, sim.ending.message) == ("PyTorchJobFailed", message)
    assert_text_and_json_agree(item)


def test_pytorchjob_exit_code_reads_only_the_pytorch_container():
    obj = pytorchjob(POLICY, containers=("sidecar", "pytorch"))
    (item,) = items(obj, events="sidecar:1,1")
    first, second = item.simulation.steps
    assert (first.what, first.counted, first.rule) == (
        "exit code 1 (application error) in container sidecar",
        True,
        None,
    )
    assert second.what == "exit code 1 (application error) in container pytorch"
    assert item.simulation.ending.reason == "PyTorchJobFailed"


def test_pytorchjob_without_a_limit_and_with_mixed_restart_policies():
    obj = pytorchjob(restart_policy="ExitCode")
    (item,) = items(obj, events=",".join(["143"] * 20))
    assert item.simulation.ending.state == "Running"
    assert item.simulation.ending.message.endswith("there is no limit")
    assert "counted (20 failures so far, no limit)" in item.simulation.steps[-1].result
    obj["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure"
    (mixed,) = items(obj)
    assert any("Master ExitCode, Worker OnFailure" in note for note in mixed.notes)


# --- every kind: JSON agrees with the text, 80 columns, the installed CLI ----------------------

KINDS = ["cronjob", "jobset", "rayjob", "pytorchjob"]
EVENTS = "143,disruption,137,1"


def long_jobset():
    name = "a-very-long-replicated-job-name-for-the-distributed-trainer"
    rules = [
        {
            "name": "restartOnAVeryLongListOfReasonsThatKeepsGoing",
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": ["BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes"],
            "onJobFailureMessagePatterns": ["a-rather-long-pattern-that-does-not-wrap-by-itself.*"],
            "targetReplicatedJobs": [name],
        }
    ]
    return jobset(
        FULL | {P + "backoff-limit": "40", P + "non-spot-attempts": "7"},
        jobs=[replicated(name, 12, containers=("a-very-long-container-name-for-the-trainer",))],
        failure_policy={"rules": rules},
        name="an-equally-long-jobset-name-that-keeps-going-and-going-on",
    )


CASES = {
    **{f"{kind}-example": (example(kind), EVENTS) for kind in KINDS},
    **{f"{kind}-plain": None for kind in KINDS},
    "jobset-long": (long_jobset(), EVENTS),
    "pytorchjob-never": (pytorchjob(restart_policy="Never", runPolicy={"backoffLimit": 1}), "1"),
    "rayjob-selector": None,
}


def case(name):
    if CASES[name] is not None:
        return CASES[name]
    if name == "rayjob-selector":
        obj = rayjob(clusterSelector={"ray.io/cluster": "shared"})
        del obj["spec"]["rayClusterSpec"]
        return obj, "1"
    obj = example(name.removesuffix("-plain"))
    del obj["metadata"]["annotations"]
    obj["spec"].pop("failurePolicy", None)
    return obj, EVENTS


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_kind_json_agrees_with_the_text(name):
    obj, events = case(name)
    for item in items(obj, events=events):
        assert_text_and_json_agree(item)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_kind_fits_80_columns(name):
    obj, events = case(name)
    for simulate in (None, events):
        text = explain.render_text(items(obj, events=simulate))
        assert len(text.splitlines()) > 15
        assert [line for line in text.splitlines() if len(line) > 80] == []


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_through_the_installed_cli(path):
    for extra in ([], ["--simulate", EVENTS], ["-o", "json", "--simulate", EVENTS]):
        result = subprocess.run(
            [str(BIN), "explain", "-f", str(path), "--kubernetes-version", "1.36", *extra],
            capture_output=True,
            text=True,
            timeout=scaled(60),
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        if "json" in extra:
            data = json.loads(result.stdout)
            assert data["items"] and all(i["allowed"] for i in data["items"])
            assert any(i["simulation"] for i in data["items"])
        else:
            # A runtime beside a TrainJob is read by it, not explained.
            docs = list(yaml.safe_load_all(path.read_text()))
            kind = next(d["kind"] for d in docs if not d["kind"].endswith("TrainingRuntime"))
            assert result.stdout.startswith(f"{kind} ml/")


def test_all_examples_in_one_stream():
    stream = "---\n".join(path.read_text() for path in sorted(EXAMPLES.glob("*.yaml")))
    argv = ["explain", "-f", "-", "-o", "json", "--kubernetes-version", "1.36"]
    code, out, err = run(argv, stdin=stream)
    assert (code, err) == (0, "")
    kinds = [item["kind"] for item in json.loads(out)["items"]]
    assert sorted(set(kinds)) == ["CronJob", "Job", "JobSet", "PyTorchJob", "RayJob", "TrainJob"]


def test_explain_page_jobset_example_is_what_the_command_prints():
    code, out, _ = run(
        ["explain", "-f", str(EXAMPLES / "jobset.yaml"), "--simulate", "143,disruption,137,1"]
    )
    assert code == 0
    workers = out.index("JobSet ml/llm-pretrain (replicatedJob workers)")
    start = out.index("Attempt plan", workers)
    end = out.index("\nNotes:", start)
    assert doc_block("<!-- explain-jobset-output -->") == out[start:end]
