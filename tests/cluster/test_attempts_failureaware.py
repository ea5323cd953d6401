"""Failure-aware retries through the real server (``retry-webhook serve`` as deployed),
whose attempt cache lists and watches Jobs and failed pods of the test suite's HTTP
Kubernetes API (testkit/fakeapi/) with the real ``kubernetes`` client: a Job OOM-killed
once gets its next pod with more memory, an Indexed Job per index, failed nodes are
avoided; a failed pod that reaches the watch after the Job's status counted it is
listed; an API that goes away leaves pods admitted unchanged, with a warning."""

from __future__ import annotations

import time
import uuid
from urllib.parse import parse_qs

import pytest

from testkit.failedpods import (
    a_job,
    admit,
    admitted_until,
    failed,
    gpu_node,
    new_pod,
    with_spare_nodes,
)
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.servers import eventually, free_port, metric, scaled, start, stop
from testkit.workloads import validate_schema
from webhook.cluster.attempts import JOB_UID_LABEL


def memory(obj: dict) -> tuple[str, str]:
    resources = obj["spec"]["containers"][0]["resources"]
    return resources["requests"]["memory"], resources["limits"]["memory"]


def avoided(obj: dict) -> list[str]:
    affinity = obj["spec"].get("affinity")
    if not affinity:
        return []
    terms = affinity["nodeAffinity"].get("requiredDuringSchedulingIgnoredDuringExecution")
    if not terms:
        return []
    return [r["values"][0] for r in terms["nodeSelectorTerms"][0]["matchFields"]]


@pytest.fixture(scope="module")
def cluster():
    api = with_spare_nodes(FakeAPI().start())
    yield api
    api.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory, cluster):
    tmp = tmp_path_factory.mktemp("failure-aware")
    write_kubeconfig(tmp / "kubeconfig", cluster.url)
    srv = start(
        tmp / "certs",
        "--kube",
        "kubeconfig",
        metrics_port=free_port(),
        env={"KUBECONFIG": str(tmp / "kubeconfig")},
    )
    yield srv
    stop(srv)


def test_a_job_oom_killed_once_gets_its_next_pod_with_more_memory_elsewhere(server, cluster):
    job = a_job("oom-once")
    cluster.put("jobs", job)
    first = new_pod(job)
    response, out = admit(server, first)
    assert "patch" not in response  # the first attempt: nothing to learn from
    cluster.put("pods", failed(first, "node-a"))
    job["status"]["failed"] = 1
    cluster.put("jobs", job)
    second = new_pod(job)
    response, out = admitted_until(server, second, lambda o: memory(o) != ("2Gi", "2Gi"))
    assert memory(out) == ("3Gi", "3Gi"), response
    assert avoided(out) == ["node-a"]
    validate_schema(out)
    warnings = response["warnings"]
    assert (
        "retry-policy: container trainer was OOM-killed once before at 2Gi: memory request "
        "2Gi -> 3Gi, limit 2Gi -> 3Gi (x1.5)"
    ) in warnings
    assert "retry-policy: keeping off 1 node(s) where earlier attempts failed: node-a" in warnings

    # The decision log (written within a second) and the counter record it.
    def logged():
        lines = [line.get("retry_actions") for line in server.logs()]
        return {"memory_raised": 1, "nodes_avoided": 1} in lines

    eventually(logged)

    def counted():
        samples = server.metrics()
        raised = metric(samples, "retry_webhook_retry_actions_total", action="memory_raised")
        nodes = metric(samples, "retry_webhook_retry_actions_total", action="nodes_avoided")
        return raised >= 1 and nodes >= 1

    eventually(counted)


def test_an_indexed_job_learns_per_index(server, cluster):
    job = a_job("indexed", completionMode="Indexed", completions=2, backoffLimitPerIndex=2)
    cluster.put("jobs", job)
    zero = new_pod(job, index=0, index_failures=0)
    cluster.put("pods", failed(zero, "node-z"))
    job["status"]["failed"] = 1
    cluster.put("jobs", job)
    again = new_pod(job, index=0, index_failures=1)
    _, out = admitted_until(server, again, lambda o: memory(o) != ("2Gi", "2Gi"))
    assert memory(out) == ("3Gi", "3Gi") and avoided(out) == ["node-z"]
    response, other = admit(server, new_pod(job, index=1, index_failures=0))
    assert memory(other) == ("2Gi", "2Gi") and avoided(other) == [], response


def test_a_failed_pod_the_watch_delivers_after_the_jobs_status_is_listed(server, cluster):
    job = a_job("late-pod")
    cluster.put("jobs", job)
    lost = failed(new_pod(job), "node-l")
    # Stored without a watch event: the Job controller counted it, our watch has not
    # delivered it yet.
    cluster.objects["pods"][lost["metadata"]["uid"]] = lost
    job["status"]["failed"] = 1
    cluster.put("jobs", job)
    before = len(cluster.requests)
    response, out = admitted_until(server, new_pod(job), lambda o: memory(o) != ("2Gi", "2Gi"))
    assert memory(out) == ("3Gi", "3Gi") and avoided(out) == ["node-l"], response
    lists = [
        (path, query)
        for path, query in cluster.requests[before:]
        if path == "/api/v1/namespaces/ml/pods"
    ]
    assert len(lists) == 1  # once: the next pods are answered from the records
    query = parse_qs(lists[0][1])
    assert query["labelSelector"] == [f"{JOB_UID_LABEL}={job['metadata']['uid']}"]
    assert query["fieldSelector"] == ["status.phase=Failed"]
    # The watch delivers it now: still one OOM kill, not two.
    cluster.put("pods", lost)
    time.sleep(0.5)
    _, out = admit(server, new_pod(job))
    assert memory(out) == ("3Gi", "3Gi")


def test_the_namespaces_limitrange_and_nodes_shape_the_next_attempt(server, cluster):
    """In namespace team-b a LimitRange caps a container at 2560Mi, and the pod may only
    use gpu nodes: after an OOM kill on g1, the only one, the next pod gets 2560Mi (not
    3Gi) and keeps off g1 by preference only; once g2 joins, off g1 as a requirement."""
    # upstream: PodValidateLimitFunc (plugin/pkg/admission/limitranger/admission.go) runs
    # after the mutating webhooks (AllOrderedPlugins, pkg/kubeapiserver/options/plugins.go).
    cluster.put(
        "limitranges",
        {
            "apiVersion": "v1",
            "kind": "LimitRange",
            "metadata": {"name": "mem", "namespace": "team-b", "uid": "lr-team-b"},
            "spec": {"limits": [{"type": "Container", "max": {"memory": "2560Mi"}}]},
        },
    )
    cluster.put("nodes", gpu_node("g1"))
    job = a_job("capped")
    job["metadata"]["namespace"] = "team-b"
    cluster.put("jobs", job)
    first = new_pod(job, spec={"nodeSelector": {"pool": "gpu"}})
    cluster.put("pods", failed(first, "g1"))
    job["status"]["failed"] = 1
    cluster.put("jobs", job)
    second = new_pod(job, spec={"nodeSelector": {"pool": "gpu"}})
    response, out = admitted_until(server, second, lambda o: memory(o) != ("2Gi", "2Gi"))
    assert memory(out) == ("2560Mi", "2560Mi"), response
    assert (
        "retry-policy: container trainer was OOM-killed once before at 2Gi: memory request "
        "2Gi -> 2560Mi, limit 2Gi -> 2560Mi (x1.5, at most LimitRange team-b/mem container "
        "max 2560Mi)"
    ) in response["warnings"]
    node_affinity = out["spec"]["affinity"]["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in node_affinity
    assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 100
    validate_schema(out, "1.35")
    cluster.put("nodes", gpu_node("g2"))
    _, out = admitted_until(server, second, lambda o: avoided(o) == ["g1"])
    assert avoided(out) == ["g1"]


def test_failures_whose_pods_are_terminating_or_gone_are_named_so(server, cluster):
    """Without a podFailurePolicy the Job controller counts a terminating pod as failed
    before it is (``isPodFailed`` in pkg/controller/job/job_controller.go), and a pod may
    be deleted before it is seen failed: 3 counted, 1 Failed pod found, 1 terminating."""
    job = a_job("terminating")
    cluster.put("jobs", job)
    cluster.objects["pods"][str(uuid.uuid4())] = failed(new_pod(job), "node-t")
    leaving = new_pod(job)
    leaving["metadata"].update(uid=str(uuid.uuid4()), deletionTimestamp="2026-11-22T00:00:00Z")
    leaving["status"] = {"phase": "Running"}
    cluster.objects["pods"][leaving["metadata"]["uid"]] = leaving
    job["status"].update(failed=3, terminating=1)
    cluster.put("jobs", job)
    response, out = admitted_until(server, new_pod(job), lambda o: memory(o) != ("2Gi", "2Gi"))
    assert memory(out) == ("3Gi", "3Gi"), response
    assert (
        "retry-policy: 2 earlier failure(s) of this Job not examined: 1 pod(s) still "
        "terminating, 1 pod(s) gone"
    ) in response["warnings"]


def test_a_list_the_api_refuses_leaves_the_pod_unchanged_with_a_warning(server, cluster):
    job = a_job("unlistable")
    cluster.put("jobs", job)
    cluster.objects["pods"][str(uuid.uuid4())] = failed(new_pod(job), "node-u")
    job["status"]["failed"] = 1
    cluster.put("jobs", job)
    cluster.pod_list_status = 503
    try:
        response, _ = admit(server, new_pod(job))
    finally:
        cluster.pod_list_status = 200
    assert "patch" not in response

    def counted():
        samples = server.metrics()
        errors = metric(samples, "retry_webhook_attempt_cache_errors_total", type="history_list")
        kept = metric(samples, "retry_webhook_attempt_cache_objects", resource="failure_histories")
        return errors >= 1 and kept >= 1

    eventually(counted)
    assert any(
        w.startswith("retry-policy: failure history unknown (")
        and "pod admitted without memory raise and node avoidance" in w
        for w in response["warnings"]
    ), response["warnings"]


def test_an_api_that_goes_away(tmp_path):
    """Jobs the cache knows are still answered from it; a pod whose history cannot be
    known is admitted unchanged with a warning, at once (the breaker)."""
    api = with_spare_nodes(FakeAPI().start())
    write_kubeconfig(tmp_path / "kubeconfig", api.url)
    env = {"KUBECONFIG": str(tmp_path / "kubeconfig")}
    srv = start(tmp_path / "certs", "--kube", "kubeconfig", env=env)
    try:
        job = a_job("known", failed=1)
        first = new_pod(job)
        api.put("pods", failed(first, "node-k"))
        api.put("jobs", job)
        _, out = admitted_until(srv, new_pod(job), lambda o: memory(o) != ("2Gi", "2Gi"))
        assert memory(out) == ("3Gi", "3Gi")
        api.stop()
        _, out = admit(srv, new_pod(job))
        assert memory(out) == ("3Gi", "3Gi") and avoided(out) == ["node-k"]
        stranger = a_job("never-seen", failed=2)
        for _ in range(2):
            started = time.monotonic()
            response, out = admit(srv, new_pod(stranger))
            assert time.monotonic() - started < scaled(3)
            assert "patch" not in response
            assert any("failure history unknown" in w for w in response["warnings"])
    finally:
        stop(srv)
