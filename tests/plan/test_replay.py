"""The replay of an audited workload's real failures against its audited plan
(``webhook.plan.replay``), judged as the Job controller judges a Job's failed pods, and
what the record keeps of each failure for it (``webhook.cluster.tries``)."""

from __future__ import annotations

import copy
import datetime as dt
import uuid

import pytest

from testkit.audits import audited_job, clock
from testkit.builders import job, stored
from testkit.fakeapi import FakeAPI
from testkit.jobsim import KUBELET_CONDITIONS, STOPPED_FALSE, JobRun
from testkit.waste import MAIN
from webhook.cluster.record import Record
from webhook.cluster.tries import MAX_TRIES, Try
from webhook.kube import failurepolicy as fp
from webhook.plan.audit import AuditedPart, AuditRecord
from webhook.plan.replay import replay

T0 = dt.datetime(2026, 11, 26, 10, 0, tzinfo=dt.timezone.utc)
#: MAIN holds 2 cores, 4 GiB and a GPU: per minute of run time, in resource-seconds.
PER_MINUTE = {"cpu": 120.0, "memory": 240.0, "nvidia.com/gpu": 60.0}
FAIL_42 = fp.non_retriable_rule([1, 143], "FailJob", "main")
NON_RETRIABLE = {"fail-non-retriable": "true", "retriable-exit-codes": "1,143"}


def _stamp(minutes: float) -> str:
    return (T0 + dt.timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def failed(n: int, code: int = 42, conditions=()) -> dict:
    """The n-th failed attempt: it ran a minute, from minute 2n to 2n + 1, and carries the
    kubelet's conditions of a stopped pod (``generateAPIPodStatus``: those of
    ``STOPPED_FALSE`` False, the others True) beside ``conditions``."""
    state = {"exitCode": code, "reason": "Error", "startedAt": _stamp(2 * n)}
    state["finishedAt"] = _stamp(2 * n + 1)
    kubelet = [
        {"type": kind, "status": "False" if kind in STOPPED_FALSE else "True"}
        for kind in KUBELET_CONDITIONS
    ]
    return {
        "metadata": {"uid": str(uuid.uuid4()), "name": f"train-{n}", "namespace": "ml"},
        "spec": {"restartPolicy": "Never", "containers": [copy.deepcopy(MAIN)]},
        "status": {
            "phase": "Failed",
            "startTime": _stamp(2 * n),
            "conditions": [*kubelet, *conditions],
            "containerStatuses": [{"name": "main", "state": {"terminated": state}}],
        },
    }


def indexed(pod: dict, index: int) -> dict:
    pod["metadata"]["annotations"] = {"batch.kubernetes.io/job-completion-index": str(index)}
    return pod


def recorded(*pods: dict, rules=()) -> Record:
    record = Record()
    for pod in pods:
        record = record.add(pod, fp.counts(fp.evaluate(rules, fp.PodFailure.from_pod(pod))), True)
    return record


def ended_job(how: str, reason: str, failed_count: int, backoff_limit: int = 6) -> dict:
    out = stored(job(name="train", containers=[MAIN]), uid="uid-train")
    out["spec"]["backoffLimit"] = backoff_limit
    out["status"] = {
        "failed": failed_count,
        "conditions": [{"type": how, "status": "True", "reason": reason}],
    }
    return out


def test_a_failure_is_kept_as_the_job_controller_matches_it_and_reads_back():
    pod = failed(1, 42, [{"type": "DisruptionTarget", "status": "True"}])
    kept = Try.of(pod, "")
    assert kept.failure.exits == (fp.ContainerExit("main", 42),)
    # Every condition, the kubelet's included, in its order and with its status.
    assert kept.failure.conditions == (
        ("PodReadyToStartContainers", "False"),
        ("Initialized", "True"),
        ("Ready", "False"),
        ("ContainersReady", "False"),
        ("PodScheduled", "True"),
        ("DisruptionTarget", "True"),
    )
    assert kept.seconds == 60 and kept.held == PER_MINUTE
    again = Record.parse(recorded(pod).text())
    assert again.tries == (kept,)
    assert fp.evaluate([fp.ignore_disruptions_rule()], again.tries[0].failure) is not None


def test_an_entry_written_before_conditions_were_kept_whole_reads_as_incomplete():
    old = ["", 1795687200, 60, [["main", 42]], ["DisruptionTarget"], {"cpu": 120}]
    kept = Try.from_json(old)
    assert not kept.complete and kept.failure.conditions == (("DisruptionTarget", "True"),)
    assert Try.from_json([*old, 3]).run == 3
    assert Try.from_json(kept.to_json()).complete


def test_the_record_keeps_the_first_tries_and_counts_the_rest():
    pods = [failed(n, 1) for n in range(MAX_TRIES + 3)]
    record = Record.parse(recorded(*pods).text())
    assert len(record.tries) == MAX_TRIES and record.more_tries == 3
    assert record.tries[0].finished < record.tries[-1].finished
    # Nothing is kept of a workload that is not audited.
    assert Record().add(pods[0], True).tries == ()


def test_failjob_on_the_first_attempt_saves_the_later_ones():
    # upstream: matchPodFailurePolicy (pkg/controller/job/pod_failure_policy.go): the first
    # matching rule; syncJob (job_controller.go): FailJob fails the Job at once.
    pods = [failed(1, 42), failed(2, 42), failed(3, 42)]
    result = replay(
        ended_job("Failed", "BackoffLimitExceeded", 3, backoff_limit=2),
        AuditedPart("spec", rules=(FAIL_42,)),
        recorded(*pods),
        NON_RETRIABLE,
    )
    assert result.differed and result.ended_at == 1 and result.saved_attempts == 2
    assert result.saved == {k: 2 * v for k, v in PER_MINUTE.items()}
    assert result.sentence() == (
        "the defaults would have failed it at once on exit 42 (fail-non-retriable) after "
        "attempt 1 of 3: 2 attempts, 120 s, 240 core-seconds, 480 GiB-seconds and "
        "120 GPU-seconds saved"
    )


def test_a_smaller_budget_ends_it_once_counted_failures_exceed_it():
    # upstream: syncJob (pkg/controller/job/job_controller.go): exceedsBackoffLimit is failed >
    # backoffLimit; an Ignore rule's failure is not counted (countFailed).
    pods = [failed(1, 1, [{"type": "DisruptionTarget", "status": "True"}]), failed(2, 1)]
    pods += [failed(3, 1), failed(4, 1)]
    result = replay(
        ended_job("Complete", "", 4),
        AuditedPart("spec", backoff_limit=1, rules=(fp.ignore_disruptions_rule(),)),
        recorded(*pods),
        {"backoff-limit": "1", "ignore-disruptions": "true"},
    )
    # The disrupted one is ignored: the 2nd and 3rd count, the 3rd is past backoffLimit 1.
    assert result.ended_at == 3 and result.saved_attempts == 1 and result.differed
    assert result.sentence().startswith(
        "the defaults would have failed it past backoffLimit 1 (backoff-limit) after attempt "
        "3 of 5, though it completed at attempt 5: 1 failed attempt, 60 s"
    )


def test_a_bigger_budget_or_an_ignore_rule_would_have_retried_longer():
    pods = [failed(1, 1), failed(2, 1)]
    result = replay(
        ended_job("Failed", "BackoffLimitExceeded", 2, backoff_limit=1),
        AuditedPart("spec", backoff_limit=4),
        recorded(*pods),
        {"backoff-limit": "4"},
    )
    assert result.differed and result.longer == 3 and result.saved == {}
    assert "retried longer" in result.sentence() and "cannot be known" in result.sentence()


def test_nothing_differs_when_the_audited_plan_ends_where_the_job_did():
    pods = [failed(1, 1), failed(2, 1)]
    result = replay(
        ended_job("Failed", "BackoffLimitExceeded", 2, backoff_limit=1),
        AuditedPart("spec", backoff_limit=1),
        recorded(*pods),
    )
    assert not result.differed
    assert result.sentence() == (
        "nothing would have differed under the defaults: it failed after 2 failed attempts "
        "either way"
    )
    done = replay(ended_job("Complete", "", 0), AuditedPart("spec", rules=(FAIL_42,)), None)
    assert not done.differed and done.attempts == 0


def test_what_cannot_be_known_is_said():
    running = ended_job("Complete", "", 0)
    running["status"] = {}
    assert replay(running, AuditedPart("spec"), None) is None
    # upstream: delayTerminalCondition (pkg/controller/job/job_controller.go): the interim
    # FailureTarget and SuccessCriteriaMet come while pods still terminate; not the end.
    for interim in ("FailureTarget", "SuccessCriteriaMet"):
        running["status"] = {"conditions": [{"type": interim, "status": "True"}]}
        assert replay(running, AuditedPart("spec"), None) is None
    # The Job controller counted 3, the record holds 1: two are not replayed.
    result = replay(ended_job("Complete", "", 3), AuditedPart("spec"), recorded(failed(1, 1)))
    assert "2 failed attempts never recorded, not replayed" in result.sentence()
    on_failure = ended_job("Failed", "BackoffLimitExceeded", 0)
    on_failure["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    result = replay(on_failure, AuditedPart("spec"), None)
    assert result.verdict == "unknown" and "restart in place" in result.sentence()


def test_attempts_never_recorded_leave_a_plan_that_did_not_end_unknown():
    # The Job controller counted 3 failures, the record holds 1 (its pods went before the
    # recorder saw them): that the defaults would have let it go on cannot be told.
    result = replay(
        ended_job("Failed", "BackoffLimitExceeded", 3, backoff_limit=2),
        AuditedPart("spec", rules=(FAIL_42,)),
        recorded(failed(1, 1)),
        NON_RETRIABLE,
    )
    assert result.verdict == "unknown" and not result.differed
    assert result.sentence() == (
        "what the defaults would have done is not known: they would not have ended it within "
        "the 1 failed attempt recorded, and 2 failed attempts never recorded, not replayed"
    )


def per_index_job(how: str, reason: str, failed_indexes: str = "") -> dict:
    out = ended_job(how, reason, 0)
    out["spec"].update(completionMode="Indexed", completions=3, backoffLimitPerIndex=2)
    del out["spec"]["backoffLimit"]
    if failed_indexes:
        out["status"]["failedIndexes"] = failed_indexes
    return out


def test_per_index_the_failed_indexes_later_attempts_are_saved():
    # upstream: isIndexFailed (pkg/controller/job/indexed_job_utils.go): FailIndex fails
    # the index; a counted failure fails it once its earlier counted failures reach
    # backoffLimitPerIndex; a failed index gets no more pods. SetDefaults_Job: backoffLimit
    # is MaxInt32 with backoffLimitPerIndex.
    fail_index = fp.non_retriable_rule([1, 143], "FailIndex", "main")
    pods = [indexed(failed(1, 42), 0), indexed(failed(2, 1), 1), indexed(failed(3, 42), 0)]
    pods += [indexed(failed(4, 42), 0), indexed(failed(5, 1), 1)]
    result = replay(
        per_index_job("Failed", "FailedIndexes", "0"),
        AuditedPart("spec", rules=(fail_index,)),
        recorded(*pods),
        NON_RETRIABLE,
    )
    assert result.differed and result.saved_attempts == 2
    assert result.sentence() == (
        "the defaults would have failed index 0 at once on exit 42 (fail-non-retriable): "
        "2 attempts, 120 s, 240 core-seconds, 480 GiB-seconds and 120 GPU-seconds saved"
    )
    # A smaller per-index budget: index 1's second counted failure fails it.
    result = replay(
        per_index_job("Complete", ""),
        AuditedPart("spec", backoff_limit_per_index=1),
        recorded(*pods),
        {"backoff-limit-per-index": "1"},
    )
    assert result.indexes == (
        "index 0 past backoffLimitPerIndex 1",
        "index 1 past backoffLimitPerIndex 1",
    )
    assert result.saved_attempts == 1  # index 0's third attempt
    assert ", though it completed: 1 failed attempt, 60 s" in result.sentence()
    # The same plan as the Job's: nothing differs.
    same = replay(
        per_index_job("Failed", "FailedIndexes", "0"), AuditedPart("spec"), recorded(*pods[:4])
    )
    assert not same.differed, same.sentence()


def test_a_sentence_names_a_few_indexes_and_counts_the_rest():
    pods = [indexed(failed(n, 42), n) for n in range(8)]
    fail_index = fp.non_retriable_rule([1, 143], "FailIndex", "main")
    result = replay(
        per_index_job("Complete", ""), AuditedPart("spec", rules=(fail_index,)), recorded(*pods)
    )
    assert len(result.indexes) == 8
    assert result.sentence().endswith(
        "index 4 at once on exit 42 and 3 more indexes, though it completed: no attempt saved"
    )
    assert len(result.sentence()) < 1024


def _on(action: str, kind: str, status: str) -> dict:
    return {"action": action, "onPodConditions": [{"type": kind, "status": status}]}


#: upstream: TestMatchPodFailurePolicy (pkg/controller/job/pod_failure_policy_test.go), its
#: cases on pod conditions, each one rule on DisruptionTarget and a failed pod with that one
#: condition: (the rule's action, its status, the pod's status, the action matched, counted).
MATCH_ON_CONDITIONS = {
    "FailIndex rule matched for pod conditions": ("FailIndex", "True", "True", "FailIndex", True),
    "ignore rule matched for pod conditions": ("Ignore", "True", "True", "Ignore", False),
    "ignore rule matches by the status=False": ("Ignore", "False", "False", "Ignore", False),
    "ignore rule matches by the status=Unknown": ("Ignore", "Unknown", "Unknown", "Ignore", False),
    "ignore rule does not match when status for pattern is False, but actual True": (
        "Ignore",
        "False",
        "True",
        None,
        True,
    ),
    "ignore rule does not match when status for pattern is True, but actual False": (
        "Ignore",
        "True",
        "False",
        None,
        True,
    ),
    "job fail rule matched for pod conditions": ("FailJob", "True", "True", "FailJob", True),
    "count rule matched for pod conditions": ("Count", "True", "True", "Count", True),
}


@pytest.mark.parametrize("case", sorted(MATCH_ON_CONDITIONS))
def test_TestMatchPodFailurePolicy_on_conditions_the_record_keeps(case):
    """Each case's failed pod kept in the record and read back is judged as upstream's
    table says (``matchOnPodConditions``: type and status, whatever they are)."""
    action, pattern, status, matched, counted = MATCH_ON_CONDITIONS[case]
    pod = failed(1, 1, [{"type": "DisruptionTarget", "status": status}])
    pod["metadata"].update(namespace="default", name="mypod")
    (kept,) = Record.parse(recorded(pod).text()).tries
    match = fp.evaluate([_on(action, "DisruptionTarget", pattern)], kept.failure)
    assert (match.action if match else None, fp.counts(match)) == (matched, counted)


def test_matchOnPodConditions_a_rule_on_a_kubelet_condition_is_replayed():
    """``Ready=False`` is on every failed pod (the kubelet's): a FailJob rule on it ends the
    Job at its first failure, as the Job controller would."""
    pods = [failed(1, 1), failed(2, 1), failed(3, 1)]
    result = replay(
        ended_job("Failed", "BackoffLimitExceeded", 3, backoff_limit=2),
        AuditedPart("spec", rules=(_on("FailJob", "Ready", "False"),)),
        recorded(*pods),
    )
    assert result.ended_at == 1 and result.saved_attempts == 2, result.sentence()
    assert result.sentence().startswith(
        "the defaults would have failed it at once on the pod condition Ready after attempt 1"
    )


def test_an_attempt_recorded_before_conditions_were_kept_whole_is_not_guessed():
    """An entry of an earlier version kept only the True conditions that are not the
    kubelet's: a rule of the defaults on Ready=False cannot judge it."""
    old = ["", 1795687200, 60, [["main", 1]], [], {"cpu": 120}]
    record = Record(tries=(Try.from_json(old),))
    result = replay(
        ended_job("Failed", "BackoffLimitExceeded", 1, backoff_limit=0),
        AuditedPart("spec", rules=(_on("FailJob", "Ready", "False"),)),
        record,
    )
    assert result.verdict == "unknown"
    assert result.sentence() == (
        "what the defaults would have done is not known: failed attempt 1 was recorded by an "
        "earlier version, without the Ready condition a rule of the defaults reads"
    )
    # Rules on what it did keep judge it as before.
    known = replay(
        ended_job("Failed", "BackoffLimitExceeded", 1, backoff_limit=0),
        AuditedPart("spec", rules=(FAIL_42,)),
        record,
    )
    assert known.verdict == "false", known.sentence()


def test_syncJob_deleteActivePods_stops_parallel_pods_where_the_defaults_end_the_job():
    """# upstream: syncJob (pkg/controller/job/job_controller.go): once a finished condition
    is decided, deleteActivePods deletes the Job's running pods: a pod running beside the
    one the defaults fail the Job on stops there, and only its time after that point is
    saved; a replacement made later is saved whole."""
    run = JobRun.store(FakeAPI(), audited_job(parallelism=2))
    audit = AuditRecord.of(run.job)
    run.clock = clock(0, 1)
    first, beside = run.new_pod(), run.new_pod()  # two pods at once, from minute 0
    pods = [run.fail(first, 42)]  # minute 1: exit 42, FailJob under the defaults
    run.clock = clock(1, 4)
    replacement = run.new_pod()
    run.clock = clock(0, 3)
    pods.append(run.fail(beside, 1))  # minute 3: it ran 3 minutes, 2 after minute 1
    run.clock = clock(1, 4)
    pods.append(run.fail(replacement, 1))  # minute 4: past backoffLimit 2
    run.sync()
    assert run.ended == "BackoffLimitExceeded"
    result = replay(run.conclude(), audit.part("spec"), recorded(*pods), audit.settings)
    assert result.ended_at == 1 and result.saved_attempts == 1
    assert result.saved_seconds == 300  # 2 minutes of the pod beside, 3 of the replacement
    assert result.saved == {k: 5 * v for k, v in PER_MINUTE.items()}


def test_per_index_one_pod_past_both_limits_ends_by_backoff_limit_first():
    """upstream: syncJob (pkg/controller/job/job_controller.go) decides BackoffLimitExceeded
    (``exceedsBackoffLimit``) before it counts failed indexes against maxFailedIndexes
    (MaxFailedIndexesExceeded): a pod that trips both ends the Job by the first."""
    out = per_index_job("Failed", "BackoffLimitExceeded", "0")
    out["spec"].update(backoffLimit=1, maxFailedIndexes=0)
    pods = [indexed(failed(1, 42), 0), indexed(failed(2, 42), 0)]
    result = replay(
        out, AuditedPart("spec", backoff_limit_per_index=1), recorded(*pods), NON_RETRIABLE
    )
    assert result.why == "past backoffLimit 1"
    assert not result.differed, result.sentence()  # the Job ended so, and so would the plan
