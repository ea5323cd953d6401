"""The runtime cache (webhook/kinds/trainjob/runtimes.py) with the real ``kubernetes``
client against an HTTP Kubernetes API (testkit/fakeapi/): lists and watches of
(Cluster)TrainingRuntimes, one GET on a miss, failing open when the API cannot answer."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from kubernetes import client

from testkit.builders import FULL
from testkit.fakeapi import TRAINER, FakeAPI
from testkit.servers import scaled
from testkit.trainer import mutate, runtime, trainjob
from webhook.kinds.trainjob.runtimes import RuntimeCache

#: A runtime's maxRestarts against the TrainJob's backoff-limit, named as the runtime's field.
CONTRADICTION = (
    "3 contradicts ClusterTrainingRuntime torch-distributed: "
    "spec.template.spec.failurePolicy.maxRestarts: 5"
)


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


def cache_for(api: FakeAPI, core: bool = False, **kwargs) -> RuntimeCache:
    """A cache on the real client; ``core``: with the core API, to read Trainer's release."""
    api_client = client.ApiClient(client.Configuration(host=api.url))
    if core:
        kwargs["core_api"] = client.CoreV1Api(api_client)
    return RuntimeCache(client.CustomObjectsApi(api_client), **kwargs)


def trainer_configmap(release: str, namespace: str = "kubeflow-system") -> dict:
    """Trainer's public ConfigMap (its kustomize overlay's ``configMapGenerator``, its Helm
    chart's templates/manager/public-configmap.yaml), readable by every authenticated
    user (a RoleBinding to system:authenticated)."""
    return {
        "metadata": {"name": "kubeflow-trainer-public", "namespace": namespace},
        "data": {"kubeflow_trainer_version": release},
    }


def gets(api: FakeAPI) -> list[str]:
    """GETs of one runtime (the cache's fallback), not its lists and watches."""
    return [path for path, _ in api.requests if path.count("/") > 4 and "runtimes/" in path]


def stored(rt: dict) -> dict:
    """A runtime as the API server stores it (metadata.uid set)."""
    rt["metadata"].setdefault("uid", str(uuid.uuid4()))
    return rt


def test_starts_with_the_first_lookup_then_answers_from_its_watch(api):
    cluster = stored(runtime(podGroupPolicy={"coscheduling": {"scheduleTimeoutSeconds": 60}}))
    cluster["spec"]["podGroupPolicy"] = cluster["spec"]["template"]["spec"].pop("podGroupPolicy")
    spot = stored(runtime(kind="TrainingRuntime", name="torch-spot"))
    api.put("clustertrainingruntimes", cluster)
    api.put("trainingruntimes", spot)
    cache = cache_for(api, lookup_timeout=5)
    try:
        assert not cache.started and api.requests == []  # nothing listed until asked
        found = cache.runtime("ClusterTrainingRuntime", "ml", "torch-distributed")
        assert found.runtime is not None
        assert found.runtime["spec"]["template"] == cluster["spec"]["template"]
        # Only what the policy reads is kept: the template and mlPolicy (node counts, MPI).
        assert found.runtime["spec"]["mlPolicy"] == cluster["spec"]["mlPolicy"]
        assert "podGroupPolicy" not in found.runtime["spec"]
        assert cache.runtime("TrainingRuntime", "ml", "torch-spot").runtime is not None
        assert cache.runtime("TrainingRuntime", "other", "torch-spot").missing
        # A runtime created later arrives through the watch: no GET.
        late = stored(runtime(name="late"))
        api.put("clustertrainingruntimes", late)
        deadline = time.monotonic() + scaled(10)
        while cache.stats()["runtimes"] < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        before = len(gets(api))
        assert cache.runtime("ClusterTrainingRuntime", None, "late").runtime is not None
        assert len(gets(api)) == before
        api.delete("clustertrainingruntimes", late["metadata"]["uid"])
        deadline = time.monotonic() + scaled(10)
        while cache.stats()["runtimes"] > 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert cache.runtime("ClusterTrainingRuntime", None, "late").missing
        stats = cache.stats()
        assert stats["synced"] and stats["started"] and stats["hits"] >= 3
    finally:
        cache.stop()


def test_a_runtime_the_watch_has_not_delivered_is_read_once(api):
    """Created a moment before the TrainJob (a file with both, applied at once): the
    cache misses and GETs it."""
    cache = cache_for(api, lookup_timeout=5)
    try:
        assert cache.runtime("ClusterTrainingRuntime", None, "nothing").missing
        rt = stored(runtime())
        with api.lock:  # stored, but no watch event yet
            api.objects["clustertrainingruntimes"][rt["metadata"]["uid"]] = rt
        found = cache.runtime("ClusterTrainingRuntime", None, "torch-distributed")
        assert found.runtime is not None
        assert f"{TRAINER}/clustertrainingruntimes/torch-distributed" in gets(api)
        assert cache.stats()["misses"] == 2
    finally:
        cache.stop()


def test_an_api_that_cannot_answer_fails_open_fast(api):
    api.fail_lists = 1000
    api.get_status = 500
    cache = cache_for(api, lookup_timeout=0.2, breaker_seconds=30)
    try:
        started = time.monotonic()
        first = cache.runtime("ClusterTrainingRuntime", None, "torch-distributed")
        assert first.runtime is None and not first.missing
        assert "unreadable: HTTP 500" in first.reason
        second = cache.runtime("ClusterTrainingRuntime", None, "torch-distributed")
        assert "Kubernetes API unavailable" in second.reason
        assert time.monotonic() - started < scaled(2)  # a first wait, then the breaker
        assert len(gets(api)) == 1
        stats = cache.stats()
        assert not stats["synced"] and stats["breaker_skips"] == 1
        assert stats["lastErrors"]
    finally:
        cache.stop()


def test_a_trainjob_is_judged_against_the_runtime_in_the_cluster(api):
    """The TrainJob's admission reads its runtime through the cache."""
    api.put("clustertrainingruntimes", stored(runtime(failure_policy={"maxRestarts": 5})))
    cache = cache_for(api, lookup_timeout=5)
    try:
        verdict, _ = mutate(trainjob(FULL), cache)
        assert not verdict.allowed
        assert CONTRADICTION in verdict.message
    finally:
        cache.stop()


def test_the_event_loop_never_waits_for_the_api(api):
    """On the server's event loop (``LoopRuntimes``, as ``LoopAttempts``), a runtime the
    cache holds comes at once; one that needs the first list or a GET is handed to a
    thread (``NeedsThread``), where the cache answers it."""
    import threading

    from webhook.serving.rsgi import NeedsThread
    from webhook.serving.worker import LoopRuntimes

    api.put("clustertrainingruntimes", stored(runtime()))
    loop = LoopRuntimes(cache_for(api, lookup_timeout=5))
    loop.loop_thread = threading.get_ident()
    try:
        with pytest.raises(NeedsThread):  # not listed yet: it would wait
            loop.runtime("ClusterTrainingRuntime", None, "torch-distributed")
        assert loop.cache.started
        assert loop.cache.wait_synced(scaled(10))
        found = loop.runtime("ClusterTrainingRuntime", None, "torch-distributed")
        assert found.runtime is not None
        with pytest.raises(NeedsThread):  # a miss needs the GET
            loop.runtime("ClusterTrainingRuntime", None, "other")
        answers = []
        worker = threading.Thread(
            target=lambda: answers.append(loop.runtime("ClusterTrainingRuntime", None, "other"))
        )
        worker.start()
        worker.join(scaled(10))
        assert answers and answers[0].missing
    finally:
        loop.cache.stop()


def test_through_the_real_server(tmp_path, api):
    """``retry-webhook serve`` as deployed, its API access the test's HTTP Kubernetes API:
    a TrainJob that contradicts its runtime is denied by /validate and by /mutate, one
    that fits gets the runtime patch; the runtime cache started with the first one."""
    from testkit.builders import apply, decode_patch, review
    from testkit.fakeapi import write_kubeconfig
    from testkit.servers import start, stop

    api.put("clustertrainingruntimes", stored(runtime(failure_policy={"maxRestarts": 5})))
    api.put("clustertrainingruntimes", stored(runtime(name="plain")))
    write_kubeconfig(tmp_path / "kubeconfig", api.url)
    server = start(
        tmp_path / "certs", "--kube", "kubeconfig", env={"KUBECONFIG": str(tmp_path / "kubeconfig")}
    )
    try:
        assert server.request("GET", "/readyz")[0] == 200  # not held back by runtimes
        denied = server.review("/validate", review(trainjob(FULL)))["response"]
        assert denied["allowed"] is False
        assert CONTRADICTION in denied["status"]["message"]
        fits = trainjob(FULL, ref={"name": "plain"})
        response = server.review("/mutate", review(fits))["response"]
        assert response["allowed"] is True
        out = apply(fits, decode_patch({"response": response}))
        assert out["spec"]["runtimePatches"][0]["manager"] == "retry-policy.dev/webhook"
        assert server.review("/validate", review(out))["response"]["allowed"] is True
        stats = json.loads(server.request("GET", "/readyz")[2])["runtimeCache"]
        assert stats["started"] and stats["synced"] and stats["runtimes"] == 2
    finally:
        stop(server)


def test_the_trainer_release_comes_from_its_public_configmap(api):
    """One GET per candidate namespace (kubeflow-system, then the Kubeflow platform's
    kubeflow), read again in the background: an upgrade is seen without a restart; a
    namespace that refuses (403) or lacks it (404) is not Trainer's, and no error."""
    api.put("clustertrainingruntimes", stored(runtime()))
    api.store("configmaps", trainer_configmap("v2.3.0", "kubeflow"))
    cache = cache_for(api, core=True, lookup_timeout=5, trainer_poll_seconds=0.1)
    try:
        found = cache.runtime("ClusterTrainingRuntime", None, "torch-distributed")
        assert found.runtime is not None and found.trainer == "v2.3.0"
        assert cache.runtime("ClusterTrainingRuntime", None, "other").trainer == "v2.3.0"
        reads = [p for p, _ in api.requests if p.endswith("/configmaps/kubeflow-trainer-public")]
        assert reads[:2] == [
            "/api/v1/namespaces/kubeflow-system/configmaps/kubeflow-trainer-public",
            "/api/v1/namespaces/kubeflow/configmaps/kubeflow-trainer-public",
        ]
        api.store("configmaps", trainer_configmap("v2.2.0", "kubeflow"))  # an upgrade
        deadline = time.monotonic() + scaled(10)
        while cache.trainer != "v2.2.0" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert cache.runtime("ClusterTrainingRuntime", None, "torch-distributed").trainer == (
            "v2.2.0"
        )
        api.forbidden.add(("configmaps", "kubeflow-trainer-public"))  # no RoleBinding
        deadline = time.monotonic() + scaled(10)
        while cache.trainer is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = cache.stats()
        assert stats["trainerVersion"] is None and stats["trainerVersionError"] == ""
    finally:
        cache.stop()


def test_without_the_core_api_the_release_is_not_known(api):
    api.put("clustertrainingruntimes", stored(runtime()))
    api.store("configmaps", trainer_configmap("v2.3.0"))
    cache = cache_for(api, lookup_timeout=5)
    try:
        assert cache.runtime("ClusterTrainingRuntime", None, "torch-distributed").trainer is None
        assert not [p for p, _ in api.requests if "configmaps" in p]
    finally:
        cache.stop()


def test_the_server_judges_resources_per_node_as_the_clusters_trainer(tmp_path, api):
    """Through ``retry-webhook serve`` against the HTTP API, Trainer v2.2.0 in the
    cluster: a TrainJob asking for GPUs only is admitted (v2.2 replaces the runtime's
    32Gi), one asking 64Gi is denied (above oom-memory-limit 16Gi); one naming a shipped
    runtime is warned of its initializers, its TTL and its pods; under v2.3.0 the first
    is denied (the 32Gi stays)."""
    from testkit.builders import review
    from testkit.fakeapi import write_kubeconfig
    from testkit.servers import start, stop
    from testkit.trainer import GPU, OOM, memory_runtime, shipped, submitted
    from webhook.kinds.trainjob.mutate import TTL_NOTE
    from webhook.kinds.workload import peers_note

    rt = stored(memory_runtime("v2.2.0"))
    api.put("clustertrainingruntimes", rt)
    tune = shipped("v2.2.0", "llama3_2_1B")
    tune["spec"]["template"]["spec"]["ttlSecondsAfterFinished"] = 3600
    api.put("clustertrainingruntimes", tune)
    api.store("configmaps", trainer_configmap("v2.2.0"))
    write_kubeconfig(tmp_path / "kubeconfig", api.url)
    server = start(
        tmp_path / "certs", "--kube", "kubeconfig", env={"KUBECONFIG": str(tmp_path / "kubeconfig")}
    )
    try:
        gpus = server.review("/mutate", review(submitted(OOM, rt, resourcesPerNode=GPU)))
        assert gpus["response"]["allowed"] is True, gpus["response"].get("status")
        asked = submitted(OOM, rt, resourcesPerNode={"requests": {"memory": "64Gi"}})
        denied = server.review("/mutate", review(asked))["response"]
        assert denied["allowed"] is False
        assert (
            "16Gi is below the memory request of container node (64Gi)"
            in (denied["status"]["message"])
        )
        stats = json.loads(server.request("GET", "/readyz")[2])["runtimeCache"]
        assert stats["trainerVersion"] == "v2.2.0"
        # The shipped torchtune runtime, given a TTL: initializers left out, the TTL and the
        # 4 pods of the trainer step said on apply.
        response = server.review("/mutate", review(submitted(FULL, tune, numNodes=4)))
        warnings = response["response"]["warnings"]
        assert response["response"]["allowed"] is True
        assert (
            "retry-policy: initializers dataset-initializer, model-initializer keep their own "
            "retries; the policy is the trainer's"
        ) in warnings
        assert TTL_NOTE in warnings and peers_note(4) in warnings
    finally:
        stop(server)
    cache = cache_for(api, core=True, lookup_timeout=5)
    api.store("configmaps", trainer_configmap("v2.3.0"))
    try:
        verdict, _ = mutate(submitted(OOM, rt, resourcesPerNode=GPU), cache)
        assert not verdict.allowed and "(32Gi)" in verdict.message
    finally:
        cache.stop()
