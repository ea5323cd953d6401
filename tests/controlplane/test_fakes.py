"""The real control plane checks the fakes of the fast tier: the pods
``webhook.kube.jobcontroller.pod_from_template`` makes (what testkit's Job controller and
the attempt cache build on) against the real Job controller's, its FailJob message against
the real one, and testkit's played kubelet against the phases the real Job controller
reads."""

from __future__ import annotations

from testkit.controlplane.harness import Kube, Served, eventually, job_manifest, pod_condition
from webhook.kube import failurepolicy as fp
from webhook.kube.jobcontroller import failjob_message, pod_from_template

EXIT = "kubelet.retry-policy.dev/exit-code"
POLICY = {"retry-policy.dev/backoff-limit": "0", "retry-policy.dev/fail-non-retriable": "true"}


def owned_by_the_job_controller(pod: dict) -> dict:
    meta = pod["metadata"]
    owner = dict(meta["ownerReferences"][0])
    return {
        "generateName": meta["generateName"],
        "labels": meta.get("labels", {}),
        "finalizers": meta.get("finalizers", []),
        "owner": {
            k: owner[k]
            for k in ("apiVersion", "kind", "name", "uid", "controller", "blockOwnerDeletion")
        },
        "hostname": pod["spec"].get("hostname"),
        "subdomain": pod["spec"].get("subdomain"),
        "env": pod["spec"]["containers"][0].get("env"),
        "index": meta.get("annotations", {}).get("batch.kubernetes.io/job-completion-index"),
        "index-failures": meta.get("annotations", {}).get(
            "batch.kubernetes.io/job-index-failure-count"
        ),
    }


def test_a_job_s_pod_is_made_as_pod_from_template_makes_it(kube: Kube, webhook: Served, ns: str):
    kube.apply(job_manifest("plain", ns, POLICY, {EXIT: "0"}))
    kube.finished(ns, "plain")
    job = kube.get("job", "plain", ns)
    (real,) = kube.pods_of(ns, "plain")
    expected = pod_from_template(job)
    have, want = owned_by_the_job_controller(real), owned_by_the_job_controller(expected)
    # The job-tracking finalizer is on it until the Job controller counted it: gone now.
    assert {**have, "finalizers": None} == {**want, "finalizers": None}
    assert "batch.kubernetes.io/job-tracking" in expected["metadata"]["finalizers"]
    for key, value in expected["metadata"]["annotations"].items():
        assert real["metadata"]["annotations"].get(key) == value, key


def test_an_indexed_job_s_pods_are_made_as_pod_from_template_makes_them(
    kube: Kube, webhook: Served, ns: str
):
    spec = {
        "completionMode": "Indexed",
        "completions": 2,
        "parallelism": 2,
        "backoffLimitPerIndex": 1,
    }
    policy = {**POLICY, "retry-policy.dev/backoff-limit": "1"}
    kube.apply(job_manifest("shard", ns, policy, {EXIT: "run"}, spec=spec))
    pods = eventually(lambda: len(kube.pods_of(ns, "shard")) == 2 and kube.pods_of(ns, "shard"), 30)
    job = kube.get("job", "shard", ns)
    for real in pods:
        index = int(real["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])
        expected = pod_from_template(job, index)
        have, want = owned_by_the_job_controller(real), owned_by_the_job_controller(expected)
        assert {**have, "finalizers": None} == {**want, "finalizers": None}, index


def test_the_failjob_message_is_the_job_controller_s(kube: Kube, webhook: Served, ns: str):
    kube.apply(job_manifest("fatal", ns, POLICY, {EXIT: "3"}))
    job = kube.finished(ns, "fatal")
    (pod,) = kube.pods_of(ns, "fatal")
    match = fp.evaluate(job["spec"]["podFailurePolicy"]["rules"], fp.PodFailure.from_pod(pod))
    assert match is not None and match.action == "FailJob"
    failed = kube.job_condition(ns, "fatal", "Failed")
    want = failjob_message(ns, pod["metadata"]["name"], match.index, container="main", code=3)
    assert failed["message"] == want


def test_the_played_kubelet_s_failed_pod_is_what_the_job_controller_judges(
    kube: Kube, webhook: Served, ns: str
):
    """What the real Job controller needs of a failed pod (``isPodFailed``: phase
    ``Failed``; the exit codes of its terminated containers), as the played kubelet
    writes it, with the kubelet's own conditions beside."""
    kube.apply(job_manifest("ended", ns, POLICY, {EXIT: "3"}))
    kube.finished(ns, "ended")
    (pod,) = kube.pods_of(ns, "ended")
    status = pod["status"]
    assert status["phase"] == "Failed"
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3 and terminated["reason"] == "Error"
    assert pod_condition(pod, "Ready")["status"] == "False"
    assert pod_condition(pod, "PodScheduled")["status"] == "True"
