"""The replay of an audited workload with the conditions our controller would have written
under its audited plan (``webhook.plan.marks``): disruptions over ``max-disruptions``, the
peers of a disrupted pod (``peer-disruptions``), restarts in place (``in-place-exit-codes``)
and the pods ``max-in-place-restarts`` replaces. Jobs admitted under audit by the real
engine, their pods made and failed as the Job controller and the kubelet do
(``testkit/jobsim.py``), each failed pod recorded as the recorder records it."""

from __future__ import annotations

import dataclasses

import pytest

from testkit.audits import audit_config, audited_job, clock, stamp
from testkit.fakeapi import FakeAPI
from testkit.jobsim import JobRun
from webhook.cluster.record import Record
from webhook.kube import failurepolicy as fp
from webhook.plan.audit import AuditRecord
from webhook.plan.replay import replay


class Played:
    """An audited Job's attempts played one after another (attempt n from minute 2n, a
    minute each, unless told otherwise), each failed pod recorded."""

    def __init__(self, defaults: dict[str, str], backoff_limit: int = 1, parallelism: int = 1):
        job = audited_job(
            backoff_limit=backoff_limit, parallelism=parallelism, config=audit_config(defaults)
        )
        self.run = JobRun.store(FakeAPI(), job)
        self.record = Record()
        self.attempt = 0

    def _keep(self, pod: dict) -> dict:
        rules = (self.run.job["spec"].get("podFailurePolicy") or {}).get("rules") or []
        counted = fp.counts(fp.evaluate(rules, fp.PodFailure.from_pod(pod)))
        self.record = self.record.add(pod, counted, True)
        self.run.sync()
        return pod

    def new(self, start: float | None = None, stop: float | None = None) -> dict:
        start = 2 * self.attempt if start is None else start
        self.run.clock = clock(start, start + 1 if stop is None else stop)
        self.attempt += 1
        return self.run.new_pod()

    def fail(self, code: int, pod: dict | None = None) -> dict:
        return self._keep(self.run.fail(pod or self.new(), code))

    def preempted(self, at: float | None = None, pod: dict | None = None) -> dict:
        """Preemption (``DisruptionTarget`` at minute ``at``, a little before its end),
        then the kubelet stops the deleted pod: 143."""
        pod = pod or self.new()
        when = stamp(at if at is not None else 2 * (self.attempt - 1) + 0.5)
        return self._keep(self.run.terminate(self.run.disrupt(pod, at=when), 143))

    def evicted(self) -> dict:
        """The kubelet's node-pressure eviction: ``Failed`` and ``DisruptionTarget``
        (``TerminationByKubelet``) in one update, which no condition of ours can precede."""
        pod = self.new()
        return self._keep(self.run.evict_by_kubelet(pod, at=self.run.clock[1]))

    def replay(self):
        job = self.run.conclude()
        audit = AuditRecord.of(job)
        return replay(job, audit.part("spec"), self.record, audit.settings)


DISRUPTIONS = {"ignore-disruptions": "true"}


@pytest.mark.parametrize(
    ("budget", "sentence"),
    [
        (
            "0",
            "nothing would have differed under the defaults: it failed after 2 failed "
            "attempts either way",
        ),
        (
            "1",
            "the defaults would have retried longer: within backoffLimit 1, up to 1 more "
            "attempt after attempt 2 of 2",
        ),
    ],
)
def test_matchPodFailurePolicy_max_disruptions_counts_those_past_its_budget(budget, sentence):
    """# upstream: matchPodFailurePolicy (pkg/controller/job/pod_failure_policy.go): the
    Count rule on retry-policy.dev/DisruptionBudgetExhausted comes first, and the
    controller adds that condition to each disrupted pod past max-disruptions; the rest
    the Ignore rule on DisruptionTarget takes. Two pods preempted, backoffLimit 1."""
    played = Played({**DISRUPTIONS, "max-disruptions": budget})
    played.preempted()
    played.preempted()
    assert played.run.ended == "BackoffLimitExceeded"
    assert played.replay().sentence().startswith(sentence)


def test_exceedsBackoffLimit_a_late_disruption_lowers_the_limit_instead():
    """A pod the kubelet evicted (``TerminationByKubelet``, in the update that fails it)
    cannot be marked: the controller lowers the Job's backoffLimit by one instead
    (``settle_late``: the same as one more counted failure), and counts nothing once it
    is 0. Past max-disruptions 0, with backoffLimit 1: the first eviction lowers it, the
    second is not counted, so the Job would have gone on (where two preemptions, marked,
    end it as they did:
    ``test_matchPodFailurePolicy_max_disruptions_counts_those_past_its_budget``)."""
    played = Played({**DISRUPTIONS, "max-disruptions": "0"})
    played.evicted()
    played.evicted()
    assert played.run.ended == "BackoffLimitExceeded"
    assert (
        played.replay()
        .sentence()
        .startswith(
            "the defaults would have retried longer: within backoffLimit 1, up to 1 more attempt"
        )
    )


def test_two_disruptions_in_one_second_at_the_budgets_edge_are_not_guessed():
    """Which of two pods disrupted in the same second was over max-disruptions 1 cannot be
    told, and it decides whether the Job fails at the second."""
    played = Played({**DISRUPTIONS, "max-disruptions": "1"}, parallelism=2)
    first, second = played.new(0, 1), played.new(0, 1)
    played.preempted(0.5, first)
    played.preempted(0.5, second)
    result = played.replay()
    assert result.verdict == "unknown"
    assert "would have been marked retry-policy.dev/DisruptionBudgetExhausted cannot be told" in (
        result.sentence()
    )


def test_matchPodFailurePolicy_peer_disruptions_marks_a_disrupted_pods_peers():
    """# upstream: matchPodFailurePolicy: the Ignore rule on retry-policy.dev/PeerDisrupted
    comes first, and the controller adds that condition to the running peers of a
    disrupted pod. Two pods at once (backoffLimit 2): one preempted at minute 1, its peer
    fails on its loss at minute 3, the replacement at minute 5."""
    played = Played({"peer-disruptions": "ignore"}, backoff_limit=2, parallelism=2)
    disrupted, peer = played.new(0, 1.5), played.new(0, 3)
    played.preempted(1, disrupted)
    played.fail(1, peer)
    played.fail(1, played.new(2, 5))
    assert played.run.ended == "BackoffLimitExceeded"
    result = played.replay()
    # The peer is ignored: two counted, not past backoffLimit 2.
    assert result.sentence().startswith(
        "the defaults would have retried longer: within backoffLimit 2, up to 1 more attempt"
    )


def test_a_peer_that_failed_within_seconds_of_the_disruption_is_not_guessed():
    """The mark is written a moment after the disruption; a peer failed within
    PEER_MARGIN of it may have been judged without it: its judgement is not known."""
    played = Played({"peer-disruptions": "ignore"}, backoff_limit=1, parallelism=2)
    disrupted, peer = played.new(0, 1.5), played.new(0, 1 + 1 / 60)
    played.preempted(1, disrupted)
    played.fail(1, peer)  # one second after the disruption
    result = played.replay()
    assert result.verdict == "unknown"
    assert "would have been marked retry-policy.dev/PeerDisrupted cannot be told" in (
        result.sentence()
    )


IN_PLACE = {"in-place-exit-codes": "3"}


@pytest.mark.parametrize(
    ("budget", "sentence"),
    [
        (
            {"max-in-place-restarts": "1"},
            "nothing would have differed under the defaults: it failed after 2 failed "
            "attempts either way",
        ),
        (
            {"max-in-place-restarts": "2"},
            "the defaults would have retried longer: 1 of its failed attempts would have "
            "been a restart in place (in-place-exit-codes); within backoffLimit 1",
        ),
        (
            {},
            "the defaults would have retried longer: 2 of its failed attempts would have "
            "been restarts in place (in-place-exit-codes); within backoffLimit 1",
        ),
    ],
)
def test_ContainerShouldRestart_in_place_exit_codes_restart_until_the_budget(budget, sentence):
    """# upstream: pastBackoffLimitOnFailure (pkg/controller/job/job_controller.go) counts
    no restart in place under restartPolicy Never; the kubelet restarts a container whose
    exit its restartPolicyRules name (ContainerShouldRestart); max-in-place-restarts ends
    the pod at its Nth restart, marked InPlaceBudgetExhausted, which a Count rule takes
    first. Two pods exit 3, backoffLimit 1."""
    played = Played({**IN_PLACE, **budget})
    played.fail(3)
    played.fail(3)
    assert played.run.ended == "BackoffLimitExceeded"
    assert played.replay().sentence().startswith(sentence)


def test_pods_side_by_side_are_not_guessed_into_one_restarting_pod():
    """Two pods at once that exit with an in-place code: which of the audited pods would
    have restarted, and when max-in-place-restarts replaces one, cannot be told."""
    played = Played({**IN_PLACE, "max-in-place-restarts": "2"}, parallelism=2)
    first, second = played.new(0, 1), played.new(0, 2)
    played.fail(3, first)
    played.fail(3, second)
    result = played.replay()
    assert result.verdict == "unknown"
    assert "attempts of the Job ran side by side" in result.sentence()


def test_a_disrupted_pod_or_one_past_its_deadline_is_no_restart_in_place():
    """A container stopped by a disruption or by the kubelet past the pod's deadline
    (``ShouldEvict``: DeadlineExceeded) is not restarted, whatever it exits with."""
    played = Played({"in-place-exit-codes": "143"})
    played.preempted()
    played.preempted()
    result = played.replay()
    assert result.sentence().startswith("nothing would have differed"), result.sentence()


def test_an_audit_record_without_the_template_is_not_guessed():
    """An audit record of revision 1 kept no labels of its parts' pod templates: what
    max-disruptions would have marked is not known."""
    played = Played({**DISRUPTIONS, "max-disruptions": "0"})
    played.preempted()
    played.preempted()
    job = played.run.conclude()
    audit = AuditRecord.of(job)
    part = dataclasses.replace(audit.part("spec"), template=None)
    result = replay(job, part, played.record, audit.settings)
    assert result.sentence() == (
        "what the defaults would have done is not known: the audit record, of an earlier "
        "version, does not keep what the defaults would have set our controller and the "
        "kubelet to do to its pods"
    )
