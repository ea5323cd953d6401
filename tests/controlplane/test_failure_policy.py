"""``fail-non-retriable`` and the retry budget under the real Job controller: the verdicts
and counts are kube-controller-manager's own (``syncJob``, ``matchPodFailurePolicy``,
``exceedsBackoffLimit``), not ours; and our own evaluation of a podFailurePolicy
(``webhook.kube.failurepolicy``, which explain, the audit replay and the fast tier use) is
checked against them."""

from __future__ import annotations

import pytest

from testkit.controlplane.harness import Kube, Served, eventually, job_manifest
from webhook.kube import failurepolicy as fp

EXIT = "kubelet.retry-policy.dev/exit-code"
POLICY = {
    "retry-policy.dev/backoff-limit": "2",
    "retry-policy.dev/fail-non-retriable": "true",
}


def failed_condition(job: dict) -> dict | None:
    return next((c for c in job["status"].get("conditions") or [] if c["type"] == "Failed"), None)


def test_a_non_retriable_exit_fails_the_job_at_once(kube: Kube, webhook: Served, ns: str):
    kube.apply(job_manifest("fatal", ns, POLICY, {EXIT: "1"}))
    job = kube.finished(ns, "fatal")
    condition = failed_condition(job)
    assert condition is not None and condition["reason"] == "PodFailurePolicy"
    # The Job controller's message names the container, the code and our FailJob rule.
    assert "exit code 1" in condition["message"] and "FailJob" in condition["message"]
    assert len(kube.pods_of(ns, "fatal")) == 1
    assert job["status"]["failed"] == 1


def test_a_retriable_exit_is_retried_and_counted_as_upstream_counts(
    kube: Kube, webhook: Served, ns: str
):
    """143 is retriable: each failure counts, and the Job fails once counted failures
    exceed backoffLimit (``exceedsBackoffLimit``): backoffLimit 2 means 3 pods."""
    kube.apply(job_manifest("retried", ns, POLICY, {EXIT: "143"}))
    job = kube.finished(ns, "retried")
    condition = failed_condition(job)
    assert condition is not None and condition["reason"] == "BackoffLimitExceeded"
    assert job["status"]["failed"] == 3
    assert len(kube.pods_of(ns, "retried")) == 3


def test_a_retried_job_succeeds_on_a_later_attempt(kube: Kube, webhook: Served, ns: str):
    kube.apply(job_manifest("later", ns, POLICY, {EXIT: "143,143,0"}))
    job = kube.finished(ns, "later")
    assert any(c["type"] == "Complete" for c in job["status"]["conditions"])
    assert job["status"]["failed"] == 2 and job["status"]["succeeded"] == 1


CASES = {
    # exit codes of the pod's containers -> what the real Job controller did with the pod
    "non-retriable": "3",
    "retriable": "143",
    "oom": "137",
}


@pytest.mark.parametrize("codes", sorted(CASES.values()), ids=sorted(CASES))
def test_our_evaluation_of_the_policy_agrees_with_the_job_controller(
    kube: Kube, webhook: Served, ns: str, codes: str
):
    """The admitted Job's own podFailurePolicy, evaluated by ``failurepolicy.evaluate``
    on the failed pod as the real kubelet and Job controller left it, gives the action
    the real Job controller took: FailJob ends the Job with ``PodFailurePolicy``; Count
    counts the pod in ``status.failed``; no match counts too."""
    name = f"judge-{codes}"
    once = {**POLICY, "retry-policy.dev/backoff-limit": "0"}
    kube.apply(job_manifest(name, ns, once, {EXIT: codes}))
    job = kube.finished(ns, name)
    pod = eventually(lambda: kube.pods_of(ns, name), 30, "the pod")[0]
    rules = job["spec"]["podFailurePolicy"]["rules"]
    match = fp.evaluate(rules, fp.PodFailure.from_pod(pod))
    ended = failed_condition(job)
    if match is not None and match.action == "FailJob":
        assert ended["reason"] == "PodFailurePolicy"
    elif match is not None and match.action == "Ignore":
        assert job["status"].get("failed", 0) == 0
    else:
        assert ended["reason"] == "BackoffLimitExceeded"
        assert job["status"]["failed"] == 1
