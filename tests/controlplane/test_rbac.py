"""The chart's RBAC and ValidatingAdmissionPolicy, enforced by the real API server on a
token of the chart's ServiceAccount: what our controller writes is allowed (checked after
every cluster test: ``no_write_of_ours_refused``), and what it never writes is refused."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import urllib.request

import yaml

from testkit.controlplane.harness import Kube, Served, job_manifest, running
from testkit.controlplane.webhook import tool

EXIT = "kubelet.retry-policy.dev/exit-code"


def as_controller(kube: Kube, served: Served, *args: str, stdin: str | None = None):
    """kubectl with the token our server acts with."""
    argv = [tool("kubectl"), "--kubeconfig", str(served.release.token_kubeconfig), *args]
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, check=False)


def test_the_controller_s_token_cannot_swap_an_image(kube: Kube, webhook: Served, ns: str):
    policy = {
        "retry-policy.dev/backoff-limit": "1",
        "retry-policy.dev/in-place-exit-codes": "42",
        "retry-policy.dev/max-in-place-restarts": "2",
    }
    kube.apply(job_manifest("victim", ns, policy, {EXIT: "run"}))
    pod = running(kube, ns, "victim")[0]
    name = pod["metadata"]["name"]
    swap = {"spec": {"containers": [{"name": "main", "image": "registry.example/miner:1"}]}}
    done = as_controller(kube, webhook, "patch", "pod", name, "-n", ns, "-p", json.dumps(swap))
    assert done.returncode != 0
    assert "ValidatingAdmissionPolicy" in done.stderr and "denied" in done.stderr, done.stderr
    assert (
        kube.get("pod", name, ns)["spec"]["containers"][0]["image"] == "registry.example/trainer:1"
    )
    # What the controller does write to that pod, a deadline for its restarts in place, is
    # allowed through the same policy.
    deadline = {"spec": {"activeDeadlineSeconds": 3600}}
    done = as_controller(kube, webhook, "patch", "pod", name, "-n", ns, "-p", json.dumps(deadline))
    assert done.returncode == 0, done.stderr


def test_the_controller_s_token_cannot_raise_a_job_s_budget(kube: Kube, webhook: Served, ns: str):
    """The policy lets the controller lower ``backoffLimit`` (with its record: see
    test_lost_nodes), never raise it."""
    kube.apply(job_manifest("budget", ns, {"retry-policy.dev/backoff-limit": "3"}, {EXIT: "run"}))
    raised = json.dumps({"spec": {"backoffLimit": 4}})
    done = as_controller(kube, webhook, "patch", "job", "budget", "-n", ns, "-p", raised)
    assert done.returncode != 0
    assert "ValidatingAdmissionPolicy" in done.stderr and "denied" in done.stderr, done.stderr
    assert kube.get("job", "budget", ns)["spec"]["backoffLimit"] == 3


def test_the_controller_s_token_cannot_create_pods_or_read_secrets(
    kube: Kube, webhook: Served, ns: str
):
    assert "no" in as_controller(kube, webhook, "auth", "can-i", "create", "pods", "-n", ns).stdout
    assert "no" in as_controller(kube, webhook, "auth", "can-i", "get", "secrets", "-n", ns).stdout
    assert "yes" in as_controller(kube, webhook, "auth", "can-i", "watch", "jobs", "-A").stdout


def test_the_controller_s_token_cannot_write_events_not_of_its_own(
    kube: Kube, webhook: Served, ns: str
):
    """RBAC grants Events in every namespace; the policy lets through only ours, about an
    object in the Event's own namespace."""
    foreign = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "forged", "namespace": ns},
        "eventTime": "2026-12-06T00:00:00.000000Z",
        "reportingController": "kubelet",
        "reportingInstance": "node-1",
        "action": "Killing",
        "reason": "Killing",
        "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": "x"},
        "note": "forged",
        "type": "Normal",
    }
    done = as_controller(kube, webhook, "create", "-f", "-", stdin=json.dumps(foreign))
    assert done.returncode != 0 and "an Event must be its own" in done.stderr, done.stderr
    ours = {
        **foreign,
        "reportingController": "retry-policy.dev/webhook",
        "reportingInstance": "test",
        "action": "Record",
        "reason": "RetryDisruptionCounted",
    }
    done = as_controller(kube, webhook, "create", "-f", "-", stdin=json.dumps(ours))
    assert done.returncode == 0, done.stderr


def test_api_priority_sends_the_controller_s_requests_to_its_own_level(
    kube: Kube, served: Served, ns: str
):
    """apiPriority.enabled: the real API server classifies a request of the webhook's
    ServiceAccount by our FlowSchema (API Priority and Fairness answers which, in the
    X-Kubernetes-PF-FlowSchema-UID header), and the controller works under it."""
    served.reconfigure({"apiPriority": {"enabled": True}})
    release = served.release
    schema = kube.get("flowschema", "retry-policy-webhook")
    level = kube.get("prioritylevelconfiguration", "retry-policy-webhook")
    assert schema is not None and level is not None
    config = yaml.safe_load(release.token_kubeconfig.read_text())
    token = config["users"][0]["user"]["token"]
    context = ssl.create_default_context(cafile=str(kube.cluster.pki.ca))
    request = urllib.request.Request(
        f"{kube.cluster.server}/api/v1/namespaces/{ns}/pods",
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(request, context=context, timeout=30) as answer:
        assert answer.headers["X-Kubernetes-PF-FlowSchema-UID"] == schema["metadata"]["uid"]
        assert answer.headers["X-Kubernetes-PF-PriorityLevel-UID"] == level["metadata"]["uid"]
    policy = {"retry-policy.dev/backoff-limit": "1", "retry-policy.dev/retry-delay": "2s"}
    kube.apply(job_manifest("prioritized", ns, policy, {EXIT: "1,0"}))
    kube.finished(ns, "prioritized", 90)
    assert kube.job_condition(ns, "prioritized", "Complete")


def test_the_controller_s_token_may_fail_only_an_unscheduled_pod_past_its_deadline(
    kube: Kube, webhook: Served, ns: str
):
    """The one phase the controller writes: ``Pending`` to ``Failed``, with a failure
    category (reason ``StartDeadline``), on a pod labelled start-deadline that no node was
    given (webhook/controller/startdeadline.py). The real API server takes the transition
    (``ValidatePodStatusUpdate``) and the policy lets exactly that through: not on a pod
    that runs, not without the category, not another category's reason."""
    # A deadline long enough that our own controller leaves these pods alone meanwhile.
    policy = {"retry-policy.dev/start-deadline": "1h", "retry-policy.dev/backoff-limit": "0"}
    nowhere = {"nodeSelector": {"kubernetes.io/hostname": "no-such-node"}}
    kube.apply(job_manifest("nowhere", ns, policy, pod_spec=nowhere))
    kube.apply(job_manifest("somewhere", ns, policy, {EXIT: "run"}))
    from testkit.controlplane.harness import eventually

    pending = eventually(lambda: kube.pods_of(ns, "nowhere"), 60, "the pod")[0]
    placed = running(kube, ns, "somewhere")[0]

    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    ours = client.CoreV1Api(config.new_client_from_config(str(webhook.release.token_kubeconfig)))

    def status(phase: str, reason: str) -> dict:
        condition = {
            "type": "retry-policy.dev/Unschedulable",
            "status": "True",
            "reason": reason,
            "message": "no node could run the pod",
        }
        return {"status": {"phase": phase, "conditions": [condition]}}

    def refused(pod: dict, body: dict) -> str:
        """The API server's answer to our controller's status patch: "" when it took it."""
        meta = pod["metadata"]
        try:
            ours.patch_namespaced_pod_status(
                meta["name"], ns, body, _content_type="application/strategic-merge-patch+json"
            )
        except ApiException as err:
            return f"{err.status} {err.body}"
        return ""

    assert "denied" in refused(placed, status("Failed", "StartDeadline"))
    assert "denied" in refused(pending, status("Failed", "PodCondition"))
    assert "denied" in refused(pending, {"status": {"phase": "Failed"}})
    assert refused(pending, status("Failed", "StartDeadline")) == ""
    assert kube.get("pod", pending["metadata"]["name"], ns)["status"]["phase"] == "Failed"
