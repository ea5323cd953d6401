"""``retry-webhook explain`` for a JobSet (``webhook.kinds.jobset.explain``): the overview and
one explanation per replicated Job, rules in words with their origin, provenance, and plan
rows by run checked against the real pod webhook."""

from __future__ import annotations

import pytest

from testkit.builders import P
from testkit.explain import rows, setting
from testkit.explainkinds import (
    RESTART_ATTEMPT,
    by_part,
    example,
    items,
    jobset,
    placed_by_pod_webhook,
    replicated,
    reviewed,
)
from webhook.kinds.jobset.explain import describe_job_failure
from webhook.policy.config import parse_config


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
