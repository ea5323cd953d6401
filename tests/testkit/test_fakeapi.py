"""The fast tier's HTTP Kubernetes API (``testkit.fakeapi``) where it must do what the
API server does for our informers to be tested at all."""

from __future__ import annotations

import json

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from testkit.fakeapi import FakeAPI


def _job(name: str) -> dict:
    meta = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": {"app": "x"}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {}}


def test_a_paged_list_is_one_snapshot_and_a_watch_from_it_misses_nothing():
    """``GetList`` (k8s.io/apiserver pkg/storage/etcd3/store.go) reads every page of a list
    at the revision its continue token carries, and that revision is the list's: a change
    made while the pages come is not in them, and a watch from the list's version sees it.
    Paged at the current state instead, an informer lost such changes for good."""
    api = FakeAPI(page_size=1).start()
    try:
        for name in ("a", "b"):
            api.put("jobs", _job(name))
        configuration = client.Configuration()
        configuration.host = api.url
        batch = client.BatchV1Api(client.ApiClient(configuration))
        first = json.loads(batch.list_job_for_all_namespaces(limit=1, _preload_content=False).data)
        api.modify("jobs", "uid-b", lambda job: job["metadata"]["labels"].update(app="y"))
        token = first["metadata"]["continue"]
        second = json.loads(
            batch.list_job_for_all_namespaces(limit=1, _continue=token, _preload_content=False).data
        )
        assert second["items"][0]["metadata"]["labels"] == {"app": "x"}  # as it was
        assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]

        resp = batch.list_job_for_all_namespaces(
            watch=True,
            resource_version=first["metadata"]["resourceVersion"],
            timeout_seconds=1,
            _preload_content=False,
        )
        events = [json.loads(line) for line in iter_resp_lines(resp)]
        assert [(e["type"], e["object"]["metadata"]["labels"]["app"]) for e in events] == [
            ("MODIFIED", "y")
        ]
    finally:
        api.stop()


def test_after_expire_a_watch_from_before_is_gone_and_only_a_relists_counts_as_opened():
    """A watch from a compacted version is answered 410 Gone (``newErrWatcher`` in
    k8s.io/apiserver pkg/storage/cacher), and the footprint benchmark counts the watches
    opened since (``opened``) to know every informer listed again."""
    api = FakeAPI().start()
    try:
        api.put("jobs", _job("a"))
        configuration = client.Configuration()
        configuration.host = api.url
        batch = client.BatchV1Api(client.ApiClient(configuration))
        old = json.loads(batch.list_job_for_all_namespaces(_preload_content=False).data)
        api.expire("jobs")
        before = api.opened["jobs"]

        def watch(version: str) -> list[dict]:
            resp = batch.list_job_for_all_namespaces(
                watch=True, resource_version=version, timeout_seconds=1, _preload_content=False
            )
            return [json.loads(line) for line in iter_resp_lines(resp)]

        gone = watch(old["metadata"]["resourceVersion"])
        assert [(e["type"], e["object"]["code"]) for e in gone] == [("ERROR", 410)]
        assert api.opened["jobs"] == before
        new = json.loads(batch.list_job_for_all_namespaces(_preload_content=False).data)
        assert watch(new["metadata"]["resourceVersion"]) == []
        assert api.opened["jobs"] == before + 1
    finally:
        api.stop()
