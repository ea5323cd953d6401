"""Events against the real API server: an Event for a workload whose namespace is being
deleted is refused with the cause client-go's ``recordEvent`` (tools/record/event.go) does
not report as an error, and our recorder counts it as moot, not as dropped."""

from __future__ import annotations

from kubernetes import client

from testkit.controlplane.harness import Kube, eventually
from testkit.servers import scaled
from webhook.cluster.events import Event, EventRecorder, Regarding

HOLD = "retry-policy.dev/test-hold"


def test_an_event_in_a_namespace_being_deleted_is_moot_not_dropped(kube: Kube):
    ns = kube.namespace("events-terminating")
    held = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "held", "namespace": ns, "finalizers": [HOLD]},
    }
    kube.apply(held)
    kube.kubectl("delete", "namespace", ns, "--wait=false")
    eventually(
        lambda: (kube.get("namespace", ns) or {}).get("status", {}).get("phase") == "Terminating",
        30,
        "the namespace terminating",
    )
    recorder = EventRecorder(client.EventsV1Api(kube.api), "webhook-0", retry_seconds=0.1)
    try:
        regarding = Regarding("batch/v1", "Job", ns, "train", "job-uid-1")
        recorder.emit(Event(regarding, "Normal", "RetryNodesAvoided", "attempt 2 of 4"))
        assert recorder.flush(scaled(30))  # (a wait for the condition, bounded)
        stats = recorder.stats()
        assert (stats["moot"], stats["dropped"], stats["written"]) == (1, 0, 0), stats
    finally:
        recorder.stop()
        kube.kubectl(
            "patch", "configmap", "held", "-n", ns, "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}', check=False,
        )  # fmt: skip


def test_a_held_repeat_whose_namespace_is_gone_is_moot_not_dropped(kube: Kube):
    """A repeat held for its Event's series outlives the namespace: the Event and its
    namespace are gone, the create answered 404 for the namespace (NamespaceLifecycle's
    lookup); nobody can read it, so it is moot (testkit's API answers the same)."""
    ns = kube.namespace("events-gone")
    recorder = EventRecorder(client.EventsV1Api(kube.api), "webhook-0", retry_seconds=0.1)
    try:
        regarding = Regarding("batch/v1", "Job", ns, "train", "job-uid-1")
        said = Event(regarding, "Normal", "RetryNodesAvoided", "attempt 2 of 4")
        recorder.emit(said)
        assert recorder.flush(scaled(30))
        recorder.emit(said)  # held for the series
        kube.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s")
        assert recorder.flush(scaled(30))
        stats = recorder.stats()
        assert (stats["written"], stats["moot"], stats["dropped"]) == (1, 1, 0), stats
    finally:
        recorder.stop()
