"""Placement by the real scheduler: the last attempts on non-spot nodes, new attempts off
the nodes where the last ones failed, and retry delays as scheduling gates that the
scheduler leaves alone until our controller removes them."""

from __future__ import annotations

import datetime as dt

from testkit.controlplane.harness import (
    Kube,
    PodWatch,
    Served,
    job_manifest,
    node_of,
    pod_condition,
)

EXIT = "kubelet.retry-policy.dev/exit-code"
SPOT = "cloud.google.com/gke-spot"


def prefer(key: str, value: str) -> dict:
    """A user's own preference, which our required placement must outweigh."""
    term = {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
    return {
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "preference": term}
                ]
            }
        }
    }


def finished_pods(kube: Kube, ns: str, job: str) -> list[dict]:
    kube.finished(ns, job, 90)
    return kube.pods_of(ns, job)


def test_the_last_attempt_runs_on_a_non_spot_node(kube: Kube, webhook: Served, ns: str):
    policy = {"retry-policy.dev/backoff-limit": "2", "retry-policy.dev/non-spot-attempts": "1"}
    job = job_manifest("spot", ns, policy, {EXIT: "143,143,0"}, pod_spec=prefer(SPOT, "true"))
    kube.apply(job)
    pods = finished_pods(kube, ns, "spot")
    assert len(pods) == 3
    nodes = [node_of(p) for p in pods]
    assert [n.startswith("spot-") for n in nodes] == [True, True, False], nodes
    assert kube.job_condition(ns, "spot", "Complete")


def test_a_new_attempt_keeps_off_the_node_where_the_last_one_failed(
    kube: Kube, webhook: Served, ns: str
):
    policy = {"retry-policy.dev/backoff-limit": "1", "retry-policy.dev/avoid-failed-nodes": "true"}
    job = job_manifest(
        "avoid", ns, policy, {EXIT: "1,0"}, pod_spec=prefer("kubernetes.io/hostname", "spot-a")
    )
    kube.apply(job)
    pods = finished_pods(kube, ns, "avoid")
    assert node_of(pods[0]) == "spot-a"
    assert node_of(pods[1]) != "spot-a"
    assert kube.job_condition(ns, "avoid", "Complete")


def test_a_retry_delay_gate_holds_the_pod_until_our_controller_releases_it(
    kube: Kube, webhook: Served, ns: str
):
    policy = {"retry-policy.dev/backoff-limit": "1", "retry-policy.dev/retry-delay": "5s"}
    with PodWatch(kube, ns) as watched:
        kube.apply(job_manifest("delayed", ns, policy, {EXIT: "1,0"}))
        pods = finished_pods(kube, ns, "delayed")
    assert kube.job_condition(ns, "delayed", "Complete")
    first, second = pods
    versions = [p for p in watched.seen if p["metadata"]["uid"] == second["metadata"]["uid"]]
    assert versions[0]["spec"].get("schedulingGates"), "the retry was not gated"
    gated = [pod_condition(p, "PodScheduled") for p in versions]
    assert any(c and c["status"] == "False" and c["reason"] == "SchedulingGated" for c in gated)
    assert not second["spec"].get("schedulingGates")
    failed_at = first["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
    started_at = second["status"]["startTime"]
    waited = parse(started_at) - parse(failed_at)
    assert waited >= dt.timedelta(seconds=5), waited


def parse(stamp: str) -> dt.datetime:
    return dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)


def test_a_pod_with_a_node_name_cannot_be_gated_as_the_api_server_says(
    kube: Kube, webhook: Served, ns: str
):
    """Our denial of ``retry-delay`` on a template that names its node, and the real API
    server's refusal that it foresees (``ValidatePodCreate``)."""
    policy = {"retry-policy.dev/backoff-limit": "1", "retry-policy.dev/retry-delay": "30s"}
    job = job_manifest("pinned", ns, policy, pod_spec={"nodeName": "spot-a"})
    done = kube.apply(job, check=False)
    assert done.returncode != 0 and "retry-policy.dev/retry-delay" in done.stderr
    assert "nodeName" in done.stderr
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gated", "namespace": ns},
        "spec": {
            "nodeName": "spot-a",
            "schedulingGates": [{"name": "example.com/hold"}],
            "containers": [{"name": "main", "image": "registry.example/trainer:1"}],
        },
    }
    refused = kube.apply(pod, check=False)
    assert refused.returncode != 0
    assert "cannot be set until all schedulingGates have been cleared" in refused.stderr
