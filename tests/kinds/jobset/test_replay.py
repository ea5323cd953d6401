"""The replay of an audited JobSet's real failures, run by run (``webhook.kinds.jobset.replay``):
a JobSet admitted under audit by the real engine, its child Jobs and pods as the JobSet
controller and the Job controller make them (``testkit.audits``, ``testkit/jobsim.py``),
each failed pod recorded as the recorder records it (``Record.add``)."""

from __future__ import annotations

import pytest

from testkit import trainer
from testkit.audits import CONFIG, audit_config, audited_jobset, child_jobs, clock, stamp
from testkit.builders import stored
from testkit.fakeapi import FakeAPI
from testkit.jobsim import JobRun
from webhook.admission import engine
from webhook.cluster.record import Record
from webhook.cluster.tries import MAX_TRIES, Try
from webhook.kinds.jobset.replay import replay_jobset
from webhook.kinds.trainjob.mutate import jobset_for
from webhook.kinds.trainjob.runtimes import GivenRuntimes
from webhook.kube import failurepolicy as fp
from webhook.plan.audit import AUDIT, AuditedPart, AuditRecord

#: MAIN holds 2 cores, 4 GiB and a GPU: per minute of run time, in resource-seconds.
PER_MINUTE = {"cpu": 120.0, "memory": 240.0, "nvidia.com/gpu": 60.0}


@pytest.fixture
def api():
    return FakeAPI()  # not served: the objects are only stored


class Played:
    """A JobSet's runs played: its child Jobs' pods failed (or succeeded) at given minutes,
    each failed pod recorded."""

    def __init__(self, api: FakeAPI, jobset: dict):
        self.api, self.jobset, self.record = api, jobset, Record()
        self.run = 0
        self.children = child_jobs(api, jobset, 0)

    def fail(self, rjob: str, start: float, stop: float, code: int) -> dict:
        child: JobRun = self.children[rjob]
        child.clock = clock(start, stop)
        pod = child.fail(child.new_pod(), code=code)
        counted = fp.counts(fp.evaluate([], fp.PodFailure.from_pod(pod)))
        self.record = self.record.add(pod, counted, True)
        return pod

    def three_retriable(self) -> None:
        """Workers fail with exit 1 (retriable under the defaults too) at minutes 0, 2, 4:
        past their backoffLimit 2 at the third."""
        for minute in (0, 2, 4):
            self.fail("workers", minute, minute + 1, 1)

    def preempt(self, rjob: str, start: float, stop: float) -> dict:
        """Preemption half a minute before the pod's end, the deleted pod stopped: 143."""
        child: JobRun = self.children[rjob]
        child.clock = clock(start, stop)
        pod = child.disrupt(child.new_pod(), at=stamp(stop - 0.5))
        pod = child.terminate(pod, 143)
        counted = fp.counts(fp.evaluate([], fp.PodFailure.from_pod(pod)))
        self.record = self.record.add(pod, counted, True)
        return pod

    def three_failjob(self, first: int = 0) -> None:
        """Workers exit 42 (FailJob under the defaults) at minutes ``first`` + 0, 2, 4: past
        their backoffLimit 2 (BackoffLimitExceeded) at the third, under their real plan."""
        for minute in (first, first + 2, first + 4):
            self.fail("workers", minute, minute + 1, 42)

    def children_only(self) -> AuditRecord:
        """The JobSet's audit record without the failurePolicy the defaults would give
        it: the child Jobs' audited parts only (the JobSet's own rules then act)."""
        audit = AuditRecord.of(self.jobset)
        return AuditRecord(audit.settings, audit.by, audit.parts)

    def succeed(self, rjob: str, start: float, stop: float) -> None:
        child = self.children[rjob]
        child.clock = clock(start, stop)
        child.succeed(child.new_pod())

    def restart(self) -> None:
        """``RestartJobSet``: a new run, its child Jobs made anew."""
        for child in self.children.values():
            self.api.delete("jobs", child.uid)
        self.run += 1
        self.children = child_jobs(self.api, self.jobset, self.run)

    def ended(self, kind: str, reason: str) -> dict:
        out = dict(self.jobset)
        condition = {"type": kind, "status": "True", "reason": reason}
        out["status"] = {"restarts": self.run, "conditions": [condition]}
        return out

    def replay(self, kind: str = "Failed", reason: str = "ReachedMaxRestarts", audit=None):
        return replay_jobset(
            self.ended(kind, reason), audit or AuditRecord.of(self.jobset), self.record
        )


def test_executeFailurePolicy_the_defaults_rule_fails_the_jobset_in_the_run_they_end(api):
    """# upstream: executeFailurePolicy, findFirstFailedPolicyRuleAndJob, ruleIsApplicable
    (jobset pkg/controllers/failure_policy.go): a run ends at its first child Job to fail;
    the JobSet's rules act on its reason, and the FailJobSet rule fail-non-retriable
    adds (on reason PodFailurePolicy) fails the JobSet there, so the later runs would not
    have run; the child Job fails past its own backoffLimit (exceedsBackoffLimit,
    kubernetes pkg/controller/job/job_controller.go) or on a FailJob rule."""
    played = Played(api, audited_jobset())
    # Run 0: workers exit 42 (FailJob under the defaults) at minute 1; the leader fails
    # retriably from 0 to 2; workers fail twice more, and past backoffLimit 2 at minute 5.
    played.fail("workers", 0, 1, 42)
    played.fail("leader", 0, 2, 1)
    played.fail("workers", 2, 3, 42)
    played.fail("workers", 4, 5, 42)
    played.restart()  # BackoffLimitExceeded: no rule of the JobSet's own applies, restarted
    # Run 1: a retriable failure, then it completes.
    played.fail("workers", 6, 7, 1)
    played.succeed("workers", 8, 9)
    played.succeed("leader", 6, 9)
    result = played.replay("Completed", "AllJobsCompleted")
    # After minute 1: the leader's last minute, and the two later attempts of workers; and
    # run 1's failed attempt.
    assert result.sentence() == (
        "the defaults would have differed: in run 0 they would have failed Job "
        "pretrain-workers-0 at once on exit 42 (fail-non-retriable) after its attempt 1, "
        "ending the run earlier: 2 attempts, 180 s, 360 core-seconds, 720 GiB-seconds and "
        "180 GPU-seconds saved; after run 0 the JobSet would have failed, though it "
        "completed (FailJobSetFailurePolicyAction: its rule retryPolicyFailNonRetriable "
        "(FailJobSet) on reason PodFailurePolicy of Job pretrain-workers-0), so run 1 would "
        "not have run: 1 attempt, 60 s, 120 core-seconds, 240 GiB-seconds and 60 GPU-seconds "
        "saved; in all 3 attempts, 240 s, 480 core-seconds, 960 GiB-seconds and 240 "
        "GPU-seconds saved"
    )
    assert result.verdict == "true"
    assert result.saved == {k: 4 * v for k, v in PER_MINUTE.items()}
    assert [r.kind for r in result.runs] == ["earlier", "skipped"]


def test_a_run_that_completed_would_have_failed_instead(api):
    played = Played(api, audited_jobset(backoff_limit=6))
    played.fail("workers", 0, 1, 42)
    played.fail("workers", 2, 3, 1)
    played.succeed("workers", 4, 5)
    played.succeed("leader", 0, 5)
    result = played.replay("Completed", "AllJobsCompleted")
    assert result.sentence().startswith(
        "the defaults would have differed: in run 0 they would have failed Job "
        "pretrain-workers-0 at once on exit 42 (fail-non-retriable) after its attempt 1, "
        "though that run completed: 1 failed attempt, 60 s"
    )
    assert result.verdict == "true"


def test_nothing_differs_when_every_failure_is_retriable(api):
    played = Played(api, audited_jobset())
    played.three_retriable()
    played.restart()
    played.succeed("workers", 6, 7)
    result = played.replay("Completed", "AllJobsCompleted")
    assert result.sentence() == (
        "nothing would have differed under the defaults: it completed after 3 failed "
        "attempts in 2 runs either way"
    )
    assert result.verdict == "false" and result.saved == {}


def test_a_bigger_budget_retries_longer_and_says_the_cost_is_not_known(api):
    played = Played(api, audited_jobset())
    played.three_retriable()
    audit = AuditRecord.of(played.jobset)
    bigger = AuditedPart("spec.replicatedJobs[workers].template.spec", backoff_limit=5)
    audit = AuditRecord(audit.settings, audit.by, (bigger,))
    result = played.replay(audit=audit)
    assert result.sentence() == (
        "the defaults would have differed: in run 0 they would have retried Job "
        "pretrain-workers-0 past its attempt 3, where it failed (past backoffLimit 2): what "
        "the longer run would have cost cannot be known"
    )
    assert result.verdict == "true" and result.saved == {}


def test_a_run_whose_failures_were_never_kept_is_not_known(api):
    """Restarted once, but the record holds no failure of run 0 (its pods went before
    any recorder saw them): that run is said not known, never guessed."""
    played = Played(api, audited_jobset())
    played.restart()
    played.succeed("workers", 6, 7)
    result = played.replay("Completed", "AllJobsCompleted")
    assert result.sentence() == (
        "nothing would have differed under the defaults in the runs recorded; run 0 is not "
        "known (none of its failures is in the record)"
    )
    assert result.verdict == "unknown"


def test_runs_past_the_tries_kept_are_not_known(api):
    played = Played(api, audited_jobset(backoff_limit=MAX_TRIES + 4))
    for n in range(MAX_TRIES + 2):
        played.fail("workers", 2 * n, 2 * n + 1, 1)
    assert played.record.more_tries == 2
    result = played.replay()
    assert result.sentence().endswith(
        "run 0 is not known (2 later failed attempts not kept in the record)"
    )
    assert result.verdict == "unknown"


def test_a_jobset_that_restarts_in_place_is_not_replayed(api):
    """# upstream: InPlaceRestart (jobset api/jobset/v1alpha2/jobset_types.go): its pods
    restart in place, so no child Job failure ends a run."""
    jobset = audited_jobset(failure_policy={"maxRestarts": 3, "restartStrategy": "InPlaceRestart"})
    played = Played(api, jobset)
    played.fail("workers", 0, 1, 42)
    result = played.replay()
    assert result.sentence() == (
        "what the defaults would have done is not known: it restarts in place "
        "(failurePolicy restartStrategy InPlaceRestart)"
    )
    assert result.verdict == "unknown"


def test_a_jobset_pods_try_keeps_its_run(api):
    """# upstream: labelAndAnnotateObject (jobset pkg/controllers/jobset_controller.go):
    the run is the child Job's ``restart-attempt``, on its pod template too."""
    played = Played(api, audited_jobset())
    played.restart()
    played.restart()
    pod = played.fail("workers", 0, 1, 42)
    kept = Try.of(pod, "workers/0")
    assert kept.run == 2
    assert Try.from_json(kept.to_json()) == kept
    assert kept.to_json()[6] == 2
    # A Job's pod: no run.
    assert Try(kept.lineage, 1.0, 1.0, kept.failure).to_json()[6] is None


def test_three_runs_ended_earlier_are_summed_and_the_note_stays_under_1_kib(api):
    """The Event's note is cut at 1 KiB (``ValidateEventCreate``): two runs are named,
    the rest counted, and what they saved summed. (Audited child Jobs' rules only: the
    JobSet restarts after each run as it did, until its maxRestarts 2.)"""
    jobset = audited_jobset(failure_policy={"maxRestarts": 2})
    jobset["metadata"]["name"] = "p" * 63
    played = Played(api, jobset)
    for run in range(3):
        played.fail("workers", 10 * run, 10 * run + 1, 42)
        played.fail("workers", 10 * run + 2, 10 * run + 3, 42)
        played.fail("workers", 10 * run + 4, 10 * run + 5, 42)
        played.restart() if run < 2 else None
    result = played.replay(audit=played.children_only())
    sentence = result.sentence()
    assert "; and 1 more run; in all 6 attempts, 360 s, 720 core-seconds" in sentence
    assert sentence.count(f"Job {'p' * 63}-workers-0 at once on exit 42") == 2
    assert len(sentence.encode()) <= 1024
    assert result.saved == {k: 6 * v for k, v in PER_MINUTE.items()}


def test_a_replicated_job_whose_pods_restart_in_place_is_not_replayed(api):
    """# upstream: pastBackoffLimitOnFailure (kubernetes pkg/controller/job/
    job_controller.go): with restartPolicy OnFailure the Job controller counts container
    restarts, which no failed pod records."""
    jobset = audited_jobset()
    jobset["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["restartPolicy"] = (
        "OnFailure"
    )
    result = Played(api, jobset).replay()
    assert result.sentence() == (
        "what the defaults would have done is not known: the pods of replicated Job workers "
        "restart in place (restartPolicy OnFailure: the Job controller counts restarts)"
    )


@pytest.mark.parametrize(
    "rule",
    [
        {"name": "stop", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
        {
            "name": "stop",
            "action": "FailJobSet",
            "onJobFailureMessagePatterns": ["failed with exit code 42 matching FailJob"],
        },
    ],
    ids=["reason", "message"],
)
def test_ruleIsApplicable_a_rule_on_the_reason_the_defaults_give_saves_the_later_run(api, rule):
    """# upstream: ruleIsApplicable, findFirstFailedPolicyRuleAndJob (jobset
    pkg/controllers/failure_policy.go): the JobSet's own rule on reason PodFailurePolicy (or
    on matchPodFailurePolicy's message, its pod's name in it) never applied to a child Job
    failed past its backoffLimit (BackoffLimitExceeded); with the defaults' FailJob rule
    the first child Job fails with that reason at its first attempt, and the rule fails
    the JobSet: its second run would not have run."""
    played = Played(api, audited_jobset(failure_policy={"maxRestarts": 1, "rules": [rule]}))
    played.three_failjob()
    played.restart()  # BackoffLimitExceeded: "stop" does not apply, RestartJobSet (1 of 1)
    played.three_failjob(6)
    result = played.replay("Failed", "ReachedMaxRestarts")
    assert result.sentence().endswith(
        "after run 0 the JobSet would have failed (FailJobSetFailurePolicyAction: its rule "
        "stop (FailJobSet) on reason PodFailurePolicy of Job pretrain-workers-0), so run 1 "
        "would not have run: 3 attempts, 180 s, 360 core-seconds, 720 GiB-seconds and 180 "
        "GPU-seconds saved; in all 5 attempts, 300 s, 600 core-seconds, 1200 GiB-seconds and "
        "300 GPU-seconds saved"
    )
    assert result.saved == {k: 5 * v for k, v in PER_MINUTE.items()}


def test_executeFailurePolicy_a_restart_where_the_jobset_failed_is_not_costed(api):
    """# upstream: executeFailurePolicy (jobset pkg/controllers/failure_policy.go): no rule
    applies to a child Job failed with reason PodFailurePolicy, so RestartJobSet, where its
    own rule on BackoffLimitExceeded failed it: what more runs would cost is not known."""
    rule = {
        "name": "budget",
        "action": "FailJobSet",
        "onJobFailureReasons": ["BackoffLimitExceeded"],
    }
    played = Played(api, audited_jobset(failure_policy={"maxRestarts": 3, "rules": [rule]}))
    played.three_failjob()
    result = played.replay("Failed", "FailJobSetFailurePolicyAction", played.children_only())
    assert result.sentence().endswith(
        "; after run 0 the JobSet would have restarted where it failed (no rule (RestartJobSet) "
        "on reason PodFailurePolicy of Job pretrain-workers-0): what more runs would have "
        "cost cannot be known"
    )
    assert result.verdict == "true"


def test_ruleIsApplicable_a_pattern_go_may_read_otherwise_is_not_guessed(api):
    """A message pattern that cannot be read as Go reads it (``anyMatchFound`` skips one
    that does not compile): what the JobSet would have done is said not known."""
    rule = {"name": "odd", "action": "FailJobSet", "onJobFailureMessagePatterns": ["[[:digit:]]"]}
    played = Played(api, audited_jobset(failure_policy={"maxRestarts": 3, "rules": [rule]}))
    played.three_failjob()
    result = played.replay(audit=played.children_only())
    assert "what the JobSet would then have done is not known (in run 0, its pattern " in (
        result.sentence()
    )


def test_status_tells_an_ended_jobset_as_a_whole(api):
    """``retry-webhook status`` reads the JobSet's own record and audit, and tells the
    replay's sentence once, its ``job`` null (no child Job speaks for the set)."""
    from webhook.cluster.record import ANNOTATION
    from webhook.status.audit import audit_lines, render_text, to_json

    played = Played(api, audited_jobset())
    played.fail("workers", 0, 1, 42)
    played.fail("workers", 2, 3, 42)
    played.fail("workers", 4, 5, 42)
    ended = played.ended("Failed", "ReachedMaxRestarts")
    ended["metadata"] = {
        **ended["metadata"],
        "annotations": {**ended["metadata"]["annotations"], ANNOTATION: played.record.text()},
    }
    expected = played.replay().sentence()
    lines = audit_lines(ended, [])
    (line,) = to_json(lines)
    assert line["job"] is None and line["sentence"] == expected
    assert render_text(lines, several=True)[-1] == f"  - {expected}"


def test_a_record_that_did_not_keep_the_audited_failure_policy_is_not_guessed(api):
    """An audit record of revision 1 kept the child Jobs' parts only: the JobSet rule
    fail-non-retriable adds is not in it, so what the JobSet would then have done is not
    known (the run itself still is)."""
    played = Played(api, audited_jobset())
    played.three_failjob()
    audit = AuditRecord.of(played.jobset)
    old = AuditRecord(audit.settings, audit.by, audit.parts, revision=1)
    result = played.replay(
        audit=AuditRecord.of({"metadata": {"annotations": {AUDIT: old.to_annotation()}}})
    )
    assert result.sentence().endswith(
        "saved; what the JobSet would then have done is not known (the audit record, of an "
        "earlier version, does not keep its audited failurePolicy)"
    )


def test_a_jobsets_disruptions_count_against_max_disruptions_across_its_runs(api):
    """# upstream: (the controller's) max-disruptions counts a JobSet's disruptions for the
    whole set, across its runs (``disruption_scope``), as a JobSet's restart recreates
    its child Jobs: with a budget of 1 the first run's disruption is free (the Job would
    have gone on), the second run's counted (it ends that run where it really ended)."""
    config = audit_config({"ignore-disruptions": "true", "max-disruptions": "1"})
    played = Played(
        api, audited_jobset(backoff_limit=0, failure_policy={"maxRestarts": 1}, config=config)
    )
    played.preempt("workers", 0, 1)
    played.restart()
    played.preempt("workers", 2, 3)
    result = played.replay("Failed", "ReachedMaxRestarts")
    assert [r.kind for r in result.runs] == ["longer", "same"], result.sentence()
    assert result.sentence().startswith(
        "the defaults would have differed: in run 0 they would have retried Job "
        "pretrain-workers-0 past its attempt 1, where it failed (past backoffLimit 0)"
    )


def test_a_jobset_made_for_an_unannotated_audited_trainjob_is_replayed(api):
    """Under audit a TrainJob nobody annotated carries nothing to its JobSet (its spec is
    left as written): the JobSet's own admission audits the namespace's defaults on it,
    so its record, the same as its TrainJob's, is replayed run by run as any JobSet's."""
    rt = trainer.runtime(job_spec={"backoffLimit": 2}, pod_spec={"restartPolicy": "Never"})
    verdict, trainjob = trainer.mutate(trainer.trainjob(), GivenRuntimes([rt]), CONFIG)
    assert verdict.allowed and "runtimePatches" not in trainjob["spec"]
    reviewed = engine.review(jobset_for(trainjob, rt), CONFIG, "ml")
    made = stored(reviewed.result, uid="uid-finetune")
    made["status"] = {"restarts": 0}
    assert AuditRecord.of(made) == AuditRecord.of(trainjob)
    played = Played(api, made)
    played.fail("node", 0, 1, 1)  # retriable under the defaults too
    played.fail("node", 2, 3, 42)  # fail-non-retriable: the JobSet fails here
    played.fail("node", 4, 5, 42)
    sentence = played.replay(reason="FailedJobs").sentence()
    assert "failed Job llm-finetune-node-0 at once on exit 42 (fail-non-retriable)" in sentence
