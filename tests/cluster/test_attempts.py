"""The attempt cache, with the real ``kubernetes`` client against an HTTP Kubernetes API."""

from __future__ import annotations

import time
import uuid

import pytest
from kubernetes import client

from testkit.attempts import cache_for, eventually, failed_pod, lookup, make_job
from testkit.fakeapi import FakeAPI, applied
from testkit.servers import scaled
from webhook.cluster.attempts import JobCache
from webhook.cluster.history import Killed


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


def test_initial_list_is_paginated_and_counts_uncounted(api):
    jobs = [make_job(f"j{i}", failed=i, uncounted=["p"] * (i % 2)) for i in range(5)]
    for job in jobs:
        api.put("jobs", job)
    cache = cache_for(api)
    try:
        pages = [
            q for path, q in api.requests if path == "/apis/batch/v1/jobs" and "watch" not in q
        ]
        assert len(pages) == 3  # 5 jobs, 2 per page
        for i, job in enumerate(jobs):
            found = lookup(cache, job)
            assert (found.failures, found.source) == (i + i % 2, "Job status (cache)")
        assert cache.stats()["jobs"] == 5 and cache.stats()["misses"] == 0
    finally:
        cache.stop()


def test_watch_events_update_and_delete(api):
    job = make_job("a", failed=0)
    api.put("jobs", job)
    cache = cache_for(api)
    try:
        assert eventually(lambda: api.watcher_count("jobs") == 1)
        job["status"]["failed"] = 2
        api.put("jobs", job)
        assert eventually(lambda: lookup(cache, job).failures == 2)
        api.delete("jobs", job["metadata"]["uid"])
        assert eventually(lambda: cache.stats()["jobs"] == 0)
    finally:
        cache.stop()


def test_failed_pods_count_when_status_lags_and_ignored_ones_do_not(api):
    job = make_job("b", failed=1, ignore_rule=True)
    api.put("jobs", job)
    cache = cache_for(api)
    try:
        assert eventually(lambda: api.watcher_count("pods") == 1)
        for _ in range(3):
            api.put("pods", failed_pod(job))
        api.put("pods", failed_pod(job, disrupted=True, exit_code=143))
        # All four pods seen (three counted, the disrupted one ignored by the rule):
        # wait for the fourth, which may come after the third made the count 3.
        assert eventually(lambda: cache.stats()["failed_pods"] == 4)
        assert eventually(lambda: lookup(cache, job).failures == 3)
    finally:
        cache.stop()


def test_miss_falls_back_to_one_get(api):
    cache = cache_for(api)
    try:
        job = make_job("late", failed=4)
        # Stored without a watch event: as if the event had not arrived yet.
        api.objects["jobs"][job["metadata"]["uid"]] = job
        found = lookup(cache, job)
        assert (found.failures, found.source) == (4, "Job status (API)")
        assert cache.stats()["misses"] == 1
    finally:
        cache.stop()


def test_api_errors_open_the_breaker(api):
    cache = cache_for(api, breaker_seconds=30)
    try:
        api.get_status = 503
        job = make_job("gone")
        first = lookup(cache, job)
        assert first.failures is None and "HTTP 503" in first.reason
        gets = len([p for p, _ in api.requests if "/namespaces/" in p])
        second = lookup(cache, job)
        assert second.failures is None and "recent errors" in second.reason
        assert len([p for p, _ in api.requests if "/namespaces/" in p]) == gets
        assert cache.stats()["breaker_skips"] == 1
    finally:
        cache.stop()


def test_slow_api_is_bounded(api):
    cache = cache_for(api, lookup_timeout=0.4)
    try:
        api.get_delay = scaled(3)
        started = time.monotonic()
        found = lookup(cache, make_job("slow"))
        assert found.failures is None
        assert time.monotonic() - started < api.get_delay * 0.8  # not the API's answer
    finally:
        cache.stop()


def test_replaced_job_with_same_name_is_not_trusted(api):
    cache = cache_for(api)
    try:
        stored = make_job("same", failed=5)
        api.objects["jobs"][stored["metadata"]["uid"]] = stored
        found = cache.job_failures("ml", "same", "another-uid")
        assert found.failures is None and "replaced" in found.reason
    finally:
        cache.stop()


def test_too_old_watch_relists(api):
    job = make_job("c", failed=1)
    api.put("jobs", job)
    api.too_old_once.add("jobs")
    cache = cache_for(api)
    try:
        assert eventually(lambda: api.watcher_count("jobs") == 1)
        lists = [q for p, q in api.requests if p == "/apis/batch/v1/jobs" and "watch" not in q]
        assert len(lists) >= 2  # listed again after the 410
        assert lookup(cache, job).failures == 1
        assert cache.stats()["watch_errors"] >= 1
    finally:
        cache.stop()


def test_list_errors_are_retried(api):
    api.fail_lists = 1
    api.put("jobs", make_job("d", failed=2))
    configuration = client.Configuration(host=api.url)
    api_client = client.ApiClient(configuration)
    cache = JobCache(client.BatchV1Api(api_client), client.CoreV1Api(api_client)).start()
    try:
        assert cache.wait_synced(scaled(10))
        assert cache.stats()["watch_errors"] == 1
    finally:
        cache.stop()


def test_the_failure_history_counts_each_failed_pod_once_across_relists(api):
    # A failed pod is modified again (the Job controller removes its finalizer) and listed
    # again after a watch expires: one OOM kill, however often it is seen.
    from webhook.cluster.history import HistoryKey

    job = make_job("h", failed=1)
    api.put("jobs", job)
    oom = failed_pod(job, exit_code=137)
    oom["metadata"]["annotations"] = {"retry-policy.dev/oom-memory-factor": "1.5"}
    oom["spec"] = {"nodeName": "node-a"}
    oom["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] = "OOMKilled"
    api.put("pods", oom)
    api.too_old_once.add("pods")  # the first watch ends with 410: listed again
    cache = cache_for(api)
    try:
        assert eventually(lambda: api.watcher_count("pods") == 1)
        lists = [q for p, q in api.requests if p == "/api/v1/pods" and "watch" not in q]
        assert len(lists) >= 2
        seen = applied(cache)
        api.put("pods", oom)  # MODIFIED
        key = HistoryKey("ml", "h", job["metadata"]["uid"], job["metadata"]["uid"], None, 1)
        assert eventually(lambda: oom["metadata"]["resourceVersion"] in seen)
        assert cache.stats()["failed_pods"] == 1
        answer = cache.job_history(key)
        assert answer.oom_kills == (Killed("main", 1),) and answer.nodes == ("node-a",)
        assert cache.stats()["history"]["lists"] == 0  # the watch had it: no list
    finally:
        cache.stop()


def test_a_watch_that_expires_mid_stream_never_counts_a_failure_twice(api):
    """Far more failed pods than any window of remembered pods, some delivered by the
    watch, then the watch expires (410 Gone: compacted, as after an API server restart)
    and the client lists everything again: each failure still counts once."""
    # upstream: a watch from a compacted resourceVersion gets an ERROR event, code 410
    # (getAllEventsSinceLocked, newErrWatcher in k8s.io/apiserver pkg/storage/cacher); the
    # client lists again (reflector.go ListAndWatch in client-go does the same).
    from webhook.cluster.history import HistoryKey

    job = make_job("many", failed=0)
    api.put("jobs", job)

    def oom_pod(i):
        made = failed_pod(job, exit_code=137)
        made["metadata"].pop("name")
        made["metadata"]["generateName"] = "many-"
        made["metadata"]["annotations"] = {
            "retry-policy.dev/oom-memory-factor": "1.5",
            "retry-policy.dev/avoid-failed-nodes": "true",
        }
        made["spec"] = {
            "nodeName": f"node-{i}",
            "containers": [{"name": "main", "resources": {"limits": {"memory": "1Gi"}}}],
        }
        made["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] = "OOMKilled"
        return made

    pods = [oom_pod(i) for i in range(45)]
    for made in pods[:40]:
        api.put("pods", made)
    cache = cache_for(api)
    try:
        assert eventually(lambda: api.watcher_count("pods") == 1)
        for made in pods[40:]:  # delivered by the watch
            api.put("pods", made)
        assert eventually(lambda: cache.stats()["history"]["lineages"] == 1)
        uid = job["metadata"]["uid"]
        key = HistoryKey("ml", "many", uid, uid, None, 45)
        assert eventually(lambda: cache.history.lookup(key) is not None)
        before = cache.job_history(key)
        listed = len([q for p, q in api.requests if p == "/api/v1/pods" and "watch" not in q])
        api.expire("pods")
        assert eventually(lambda: api.watcher_count("pods") == 0, timeout=2)
        assert eventually(
            lambda: (
                len([q for p, q in api.requests if p == "/api/v1/pods" and "watch" not in q])
                > listed
            )
        )
        assert eventually(lambda: api.watcher_count("pods") == 1)
        assert cache.stats()["watch_errors"] >= 1
        after = cache.job_history(key)
        assert after == before
        assert after.oom_kills == (Killed("main", 45, 2**30, 2**30),) and after.failures == 45
        assert len(after.nodes) == 16 and after.nodes[-5:] == tuple(
            f"node-{i}" for i in range(40, 45)
        )
        assert cache.stats()["failed_pods"] == 45 and lookup(cache, job).failures == 45
        assert cache.stats()["history"]["lists"] == 0
    finally:
        cache.stop()


# --- LimitRanges and Nodes: the same list and watch, their own caches -------------------


def core_api(api):
    return client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))


def limit_range(name, memory, kind="Container"):
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": name, "namespace": "ml", "uid": str(uuid.uuid4())},
        "spec": {"limits": [{"type": kind, "max": {"memory": memory}}]},
    }


def test_limit_ranges_are_watched_and_a_relist_is_swapped_in_whole(api):
    from webhook.cluster.limits import LimitRangeCache

    tight = limit_range("tight", "4Gi")
    api.put("limitranges", tight)
    api.put("limitranges", limit_range("loose", "8Gi"))
    cache = LimitRangeCache(core_api(api)).start()
    try:
        assert cache.wait_synced(scaled(10))
        bounds = cache.limit_ranges("ml")
        assert bounds.known and bounds.limits.container_max.text == "4Gi"
        assert cache.limit_ranges("other").limits.container_max is None
        api.put("limitranges", limit_range("pod", "6Gi", kind="Pod"))
        assert eventually(lambda: cache.limit_ranges("ml").limits.pod_max is not None)
        api.delete("limitranges", tight["metadata"]["uid"])
        assert eventually(lambda: cache.limit_ranges("ml").limits.container_max.text == "8Gi")

        # Expired: listed again, and every lookup meanwhile sees the old set or the new.
        def lists():
            return sum(
                1 for p, q in api.requests if p == "/api/v1/limitranges" and "watch" not in q
            )

        before, seen = lists(), set()
        api.expire("limitranges")
        deadline = time.monotonic() + scaled(5)
        while time.monotonic() < deadline and lists() == before:
            seen.add(cache.limit_ranges("ml").limits.container_max.text)
        assert lists() > before and cache.stats()["watch_errors"] >= 1  # the 410, a relist
        for _ in range(200):
            seen.add(cache.limit_ranges("ml").limits.container_max.text)
            time.sleep(0.002)
        assert seen == {"8Gi"}
    finally:
        cache.stop()


def test_limit_ranges_that_cannot_be_listed_are_unknown(api):
    from webhook.cluster.limits import LimitRangeCache

    api.fail_lists = 1000
    cache = LimitRangeCache(core_api(api)).start()
    try:
        assert eventually(lambda: cache.stats()["watch_errors"] >= 1)
        answer = cache.limit_ranges("ml")
        assert not answer.known and answer.reason == "LimitRanges unreadable: HTTP 500"
    finally:
        api.fail_lists = 0
        cache.stop()


def a_node(name, ready=True, pool="gpu", heartbeat="t0"):
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {"pool": pool}},
        "spec": {},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "lastHeartbeatTime": heartbeat,
                }
            ]
        },
    }


def test_the_node_cache_starts_with_the_first_question_and_follows_the_nodes(api):
    from webhook.cluster.nodes import NodeCache
    from webhook.kube.scheduling import placement

    api.put("nodes", a_node("g1"))
    api.put("nodes", a_node("g2"))
    cache = NodeCache(core_api(api), lookup_timeout=5.0)
    question = placement({"nodeSelector": {"pool": "gpu"}}, ("g1",))
    try:
        assert not cache.stats()["started"]  # not yet: nothing lists
        assert not any(path == "/api/v1/nodes" for path, _ in api.requests)
        assert cache.placement(question).fits  # waited for the first list
        assert cache.stats()["evaluated"] == 1
        g2 = a_node("g2", heartbeat="t1")
        seen = applied(cache)
        api.put("nodes", g2)  # a heartbeat: nothing placement reads
        assert eventually(lambda: g2["metadata"]["resourceVersion"] in seen)
        assert cache.placement(question).fits and cache.stats()["evaluated"] == 1
        api.put("nodes", a_node("g2", ready=False))
        assert eventually(lambda: not cache.placement(question).fits)
        api.delete("nodes", "uid-g2")
        api.put("nodes", a_node("g3"))
        assert eventually(lambda: cache.placement(question).fits)
        assert cache.stats()["nodes"] == 2
    finally:
        cache.stop()


def test_nodes_that_cannot_be_listed_are_unknown_at_once(api):
    from webhook.cluster.nodes import NodeCache
    from webhook.kube.scheduling import placement

    api.fail_lists = 1000
    cache = NodeCache(core_api(api), lookup_timeout=0.3)
    try:
        started = time.monotonic()
        answer = cache.placement(placement({}, ("g1",)))
        assert time.monotonic() - started < scaled(2)
        assert not answer.known and answer.reason.startswith("Nodes unreadable")
    finally:
        api.fail_lists = 0
        cache.stop()


def test_a_pass_over_many_nodes_is_left_to_a_thread(api, monkeypatch):
    """The server's event loop takes only answers that cost nothing: a question no pass
    has answered yet, over many Nodes, is handed to a thread (``NeedsThread``)."""
    from webhook.cluster import nodes
    from webhook.kube.scheduling import placement

    monkeypatch.setattr(nodes, "AT_ONCE_NODES", 1)
    for name in ("g1", "g2"):
        api.put("nodes", a_node(name))
    cache = nodes.NodeCache(core_api(api), lookup_timeout=5.0)
    question = placement({}, ("g1",))
    try:
        assert cache.placement(question).fits  # (starts the cache, waits for its list)
        other = placement({}, ("g2",))
        assert cache.answer_at_once(other) is None
        assert cache.placement(other).fits
        assert cache.answer_at_once(other) == cache.placement(other)  # kept: at once now
    finally:
        cache.stop()
