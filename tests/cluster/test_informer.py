"""The list-then-watch informer every cache runs (``webhook.cluster.informer``), against
the test API over HTTP with the real ``kubernetes`` client."""

from __future__ import annotations

import threading

from kubernetes import client

from testkit.fakeapi import FakeAPI
from testkit.servers import eventually

MANAGED = [
    {
        "manager": "kubectl-client-side-apply",
        "operation": "Update",
        "apiVersion": "batch/v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:backoffLimit": {}}},
    }
]


def _job(name: str) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "labels": {"app": "train"},
            "managedFields": MANAGED,
        },
        "spec": {"backoffLimit": 2},
    }


def test_objects_reach_the_caches_without_their_managed_fields():
    """controller-runtime's ``TransformStripManagedFields``: no cache reads managedFields,
    and they are held for every object while a list's pages come in. Listed and watched
    objects alike arrive without them; the rest of their metadata is kept, and their
    namespace is one string however many objects carry it."""
    from webhook.cluster.informer import Informer

    api = FakeAPI(page_size=1).start()
    try:
        api.put("jobs", _job("a"))
        api.put("jobs", _job("b"))  # two pages of one
        configuration = client.Configuration()
        configuration.host = api.url
        batch = client.BatchV1Api(client.ApiClient(configuration))
        seen: list[tuple[str, dict]] = []
        stop = threading.Event()
        informer = Informer(
            "jobs",
            batch.list_job_for_all_namespaces,
            seen.clear,
            lambda kind, obj: seen.append((kind, obj)),
            {},
            stop,
        )
        thread = threading.Thread(target=informer.run, daemon=True)
        thread.start()
        try:
            eventually(lambda: len(seen) == 2, 10)
            api.put("jobs", _job("c"))
            eventually(lambda: len(seen) == 3, 10)
        finally:
            stop.set()
        assert [obj["metadata"]["name"] for _, obj in seen] == ["a", "b", "c"]
        assert all("managedFields" not in obj["metadata"] for _, obj in seen)
        assert all(obj["metadata"]["labels"] == {"app": "train"} for _, obj in seen)
        # each decoded anew, kept once: the namespace every cache keys by is interned
        assert len({id(obj["metadata"]["namespace"]) for _, obj in seen}) == 1
        with api.lock:  # the store keeps its own
            assert api.objects["jobs"]["uid-a"]["metadata"]["managedFields"] == MANAGED
    finally:
        api.stop()


def _paged(api: FakeAPI, applied: list, at_request: list):
    configuration = client.Configuration()
    configuration.host = api.url
    batch = client.BatchV1Api(client.ApiClient(configuration))

    def list_fn(**kwargs):
        if not kwargs.get("watch"):
            at_request.append(len(applied))  # what the cache held as this page was asked
        return batch.list_job_for_all_namespaces(**kwargs)

    return list_fn


def test_a_first_list_is_applied_page_by_page_and_a_relist_only_when_staged():
    """Memory: a list of 100,000 Jobs decoded whole is most of the controller's memory
    (docs/SCALE.md), so a first list (nothing answers from the store before it syncs)
    hands each page's objects on before the next page is asked for. A relist empties the
    store only once all its pages are in, unless the cache stages it (``ListedWhole``:
    lookups read the old store until ``relisted``), which is streamed as well."""
    from webhook.cluster.informer import Informer

    api = FakeAPI(page_size=1).start()
    try:
        for name in ("a", "b", "c"):
            api.put("jobs", _job(name))
        for staged, relist in ((False, [3, 3, 3]), (True, [0, 1, 2])):
            applied: list[str] = []
            at_request: list[int] = []
            objects: list[dict] = []

            def apply(kind, obj, seen=applied, kept=objects):
                seen.append(obj["metadata"]["name"])
                kept.append(obj)

            informer = Informer(
                "jobs",
                _paged(api, applied, at_request),
                applied.clear,
                apply,
                {},
                threading.Event(),
                staged=staged,
            )
            informer._list()
            assert (at_request, sorted(applied)) == ([0, 1, 2], ["a", "b", "c"])
            at_request.clear()
            objects.clear()
            informer._list()
            assert (at_request, sorted(applied)) == (relist, ["a", "b", "c"]), staged
            # Held packed until the last page came (not staged), or streamed: either
            # way each object arrives whole, without its managed fields.
            assert all(o["spec"] == {"backoffLimit": 2} for o in objects)
            assert all(o["metadata"]["labels"] == {"app": "train"} for o in objects)
            assert not any("managedFields" in o["metadata"] for o in objects)
    finally:
        api.stop()


def test_a_relists_pages_are_held_packed_and_unpacked_as_they_were():
    """A relist of a cache that does not stage it holds its pages until the last has
    come: packed (compressed JSON, without managed fields). At 100,000 Jobs the decoded
    pages took as much memory again as the caches (docs/SCALE.md, the relist's peak)."""
    import copy
    import json

    from webhook.cluster.informer import _pack, _unpack

    page = [_job(f"train-{i}") for i in range(500)]
    packed = _pack(copy.deepcopy(page))
    for job in page:
        del job["metadata"]["managedFields"]
    assert _unpack(packed) == page
    assert len(packed) * 5 < len(json.dumps(page))
