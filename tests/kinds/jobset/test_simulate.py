"""``retry-webhook explain --simulate`` for a JobSet (``webhook.kinds.jobset.simulate``): its
failure policy's rules matched as JobSet matches them, restarts counted and not, message
patterns, target replicated Jobs, and the child Jobs' own retries."""

from __future__ import annotations

import pytest

from testkit.builders import P
from testkit.explainkinds import by_part, example, items, jobset, jobset_sim, replicated
from webhook import explain
from webhook.kinds.jobset.simulate import jobset_rule_matches


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


def test_jobset_simulate_note_and_unknown_container():
    overview = items(example("jobset"), events="143")[0]
    assert any("see each replicated Job below" in note for note in overview.notes)
    with pytest.raises(explain.ExplainError) as caught:
        items(example("jobset"), events="ghost:1")
    # A container of no replicated Job (an event fails the pod of the Job it names).
    assert "'ghost', which no pod of JobSet/llm-pretrain has" in str(caught.value)
