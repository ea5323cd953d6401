"""The test suite's builders make objects as a cluster sends them (testkit/builders.py's doc
says why and names the upstream functions); every test that uses them relies on this."""

from __future__ import annotations

import pytest

from testkit.builders import job, job_owner, pod, review, stored
from testkit.workloads import admitted


def test_a_create_review_carries_no_system_fields():
    # upstream: createHandler calls rest.WipeObjectMetaSystemFields before admission
    # (k8s.io/apiserver pkg/endpoints/handlers/create.go); Store.create assigns uid and
    # creationTimestamp after it (rest.FillObjectMetaSystemFields).
    for obj in (
        job({"retry-policy.dev/backoff-limit": "1"}),
        pod(owner=job_owner()),
        admitted({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {}}),
    ):
        sent = review(obj)["request"]["object"]["metadata"]
        assert not {"uid", "resourceVersion", "creationTimestamp"} & set(sent), sent


def test_a_controllers_pod_has_a_generated_name_only():
    # upstream: the Job controller creates pods with GenerateName "<job>-" (GetPodFromTemplate
    # in pkg/controller/controller_utils.go; "<job>-<index>-" from podGenerateNameWithIndex
    # for an Indexed Job); the name is generated in BeforeCreate, after admission.
    made = pod(owner=job_owner("train"))
    assert made["metadata"]["generateName"] == "train-" and "name" not in made["metadata"]
    assert review(made)["request"]["name"] == ""
    assert pod()["metadata"]["name"] == "train-abcde"  # a person's bare pod is named


def test_a_review_refuses_a_create_shaped_otherwise():
    with pytest.raises(AssertionError, match="carries no"):
        review(stored(job()))


def test_a_stored_object_has_what_the_store_assigned():
    obj = stored(pod(owner=job_owner("train")))
    meta = obj["metadata"]
    assert meta["name"].startswith("train-") and meta["uid"] and meta["resourceVersion"]
    assert review(obj, operation="UPDATE", old=obj)["request"]["object"] is obj
