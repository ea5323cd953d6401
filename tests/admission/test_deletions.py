"""Disruptions by deletion (``webhook.admission.deletions``, ``webhook.cluster.deletions``):
a pod a configured disruptor deletes gets ``DisruptionTarget`` and the Job's Ignore rule
takes it as it takes an evicted pod. The DELETE review is built as the API server sends
it (``oldObject`` the stored pod, no ``object``, the deleter's ``userInfo``, DeleteOptions),
and the test API stores the deletion as the API server does (``deletionTimestamp`` while
the Job controller's finalizer is on)."""

from __future__ import annotations

import copy
import time

import pytest

from testkit.builders import P
from testkit.controllers import admitted_job
from testkit.deletions import KARPENTER, deletion, marker, verdict_of
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.jobsim import JobRun
from testkit.servers import eventually, free_port, scaled, start, stop
from webhook.admission import review as codec
from webhook.admission.deletions import Deleted
from webhook.kube import failurepolicy as fp
from webhook.policy.config import parse_config

IGNORE = {P + "ignore-disruptions": "true", P + "backoff-limit": "0"}


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


def conditions(pod: dict) -> dict[str, dict]:
    return {c["type"]: c for c in pod["status"].get("conditions") or []}


# --- what the webhook asks for ----------------------------------------------------------------


def test_a_disruptors_deletion_is_allowed_and_asks_for_the_mark(api):
    run = JobRun.store(api, admitted_job(IGNORE))
    pod = run.new_pod()
    verdict = verdict_of(deletion(pod, grace=30))
    assert verdict.allowed and verdict.patch == [] and verdict.warnings == []
    assert verdict.deleted == Deleted(
        "ml", pod["metadata"]["name"], pod["metadata"]["uid"], KARPENTER, 30
    )
    answer = codec.encode("x", verdict)["response"]
    assert answer == {"uid": "x", "allowed": True}  # nothing of it is encoded


@pytest.mark.parametrize(
    ("case", "review"),
    [
        ("another user", lambda p: deletion(p, "alice")),
        ("not a disruptor here", lambda p: deletion(p, "system:serviceaccount:kube-system:other")),
        ("no ignore-disruptions", None),
        ("already failed", "Failed"),
        ("already succeeded", "Succeeded"),
        ("already disrupted", "disrupted"),
    ],
)
def test_other_deletions_are_allowed_and_left_alone(api, case, review):
    run = JobRun.store(api, admitted_job(IGNORE if case != "no ignore-disruptions" else {}))
    pod = run.new_pod()
    if review == "disrupted":
        pod = run.disrupt(pod, delete=False)
    elif isinstance(review, str):
        pod["status"]["phase"] = review
    verdict = verdict_of(review(pod) if callable(review) else deletion(pod))
    assert verdict.allowed and verdict.deleted is None, case


def test_the_configs_disruptors_replace_the_defaults():
    cfg = parse_config("disruptors: {users: [], groups: [ops:node-scalers]}")
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ml",
            "uid": "u",
            "labels": {P + "ignore-disruptions": "true"},
        },
        "status": {"phase": "Running"},
    }
    assert verdict_of(deletion(pod), cfg).deleted is None  # Karpenter is not one here
    review = deletion(pod, "someone")
    review["request"]["userInfo"]["groups"].append("ops:node-scalers")
    assert verdict_of(review, cfg).deleted is not None


# --- the mark ----------------------------------------------------------------------------------


def test_a_pod_karpenter_deletes_is_ignored_like_an_evicted_one(api, tmp_path):
    """The condition lands while the pod terminates; the kubelet stops it (143); the
    Job's Ignore rule on DisruptionTarget takes it: not counted, the Job (backoffLimit 0)
    goes on. Without the mark the same pod is counted and fails the Job."""
    marks = marker(api, tmp_path)
    uids = []
    for marked in (True, False):
        run = JobRun.store(api, admitted_job(IGNORE, f"train-{marked}"))
        uids.append(run.uid)
        pod = run.new_pod()
        verdict = verdict_of(deletion(pod))
        with api.lock:  # the deletion is stored after admission
            api.delete_pod("ml", pod["metadata"]["name"], None)
        if marked:
            assert marks.mark(verdict.deleted) == "marked"
            found = conditions(run.current(pod))[fp.DISRUPTION_TARGET]
            assert found["reason"] == "DeletionByDisruptor" and KARPENTER in found["message"]
        run.fail(pod, 143)
        assert run.judge(pod) == ("Ignore" if marked else "none")
        assert (run.ended == "") is marked
    marks.events.flush()
    with api.lock:
        (event,) = [
            e for e in api.named["events"].values() if e["reason"] == "RetryDisruptionRecognized"
        ]
    assert event["regarding"]["kind"] == "Job" and event["regarding"]["uid"] == uids[0]
    assert "deleted by system:serviceaccount:kube-system:karpenter" in event["note"]


def test_a_forced_deletion_is_marked_and_said_so(api, tmp_path):
    """gracePeriodSeconds 0: the Job's pod keeps its finalizer, so it stays until judged."""
    run = JobRun.store(api, admitted_job(IGNORE))
    pod = run.new_pod()
    verdict = verdict_of(deletion(pod, grace=0))
    assert verdict.deleted.forced
    with api.lock:
        api.delete_pod("ml", pod["metadata"]["name"], 0)
    assert marker(api, tmp_path).mark(verdict.deleted) == "marked"
    message = conditions(run.current(pod))[fp.DISRUPTION_TARGET]["message"]
    assert message.startswith("forced deletion by system:serviceaccount:kube-system:karpenter")


def test_the_mark_waits_for_the_deletion_and_drops_one_never_stored(api, tmp_path):
    """The DELETE is admitted before it is stored, and a later admission may refuse it:
    no deletionTimestamp within the wait, no mark (a pod that goes on running must not
    carry DisruptionTarget)."""
    run = JobRun.store(api, admitted_job(IGNORE))
    pod = run.new_pod()
    verdict = verdict_of(deletion(pod))
    marks = marker(api, tmp_path)
    assert marks.mark(verdict.deleted) == "not_deleted"
    assert fp.DISRUPTION_TARGET not in conditions(run.current(pod))
    with api.lock:
        api.delete_pod("ml", pod["metadata"]["name"], None)
    assert marks.mark(verdict.deleted) == "marked"
    assert marks.mark(verdict.deleted) == "already"  # a second DELETE by the disruptor


def test_a_pod_that_failed_first_is_late_and_one_judged_is_missed(api, tmp_path):
    run = JobRun.store(api, admitted_job(IGNORE))
    marks = marker(api, tmp_path)
    late, missed = run.new_pod(), run.new_pod()
    verdicts = [verdict_of(deletion(p)) for p in (late, missed)]
    with api.lock:
        for p in (late, missed):
            api.delete_pod("ml", p["metadata"]["name"], None)
    run.fail(late, 143)
    run.fail(missed, 143)
    with api.lock:  # the Job controller judged it, but it stays (another finalizer)
        api.objects["pods"][missed["metadata"]["uid"]]["metadata"]["finalizers"] = ["other"]
    assert marks.mark(verdicts[0].deleted) == "late"
    assert run.judge(late) == "Ignore"  # its sync had not run yet: the mark still decides
    assert marks.mark(verdicts[1].deleted) == "missed"


# --- through the real server --------------------------------------------------------------------


def test_the_server_marks_a_pod_a_disruptor_deletes_and_counts_it(api, tmp_path):
    """The server as deployed answers the DELETE at once and marks the pod off the
    admission path; a dry run marks nothing; the chart grants every call the worker made,
    and its admission policy lets the mark through (``testkit/vap.py``)."""
    from testkit.chart import NAMESPACE as CHART_NS
    from testkit.chart import deployment_pod, one, render
    from testkit.rbac import calls, denied
    from testkit.tools import tool
    from testkit.vap import Policy, gate

    chart = render(tool("helm"), {"controller": {"enabled": False}})
    user = f"system:serviceaccount:{CHART_NS}:{deployment_pod(chart)['spec']['serviceAccountName']}"
    api.admit = gate(Policy(one(chart, "ValidatingAdmissionPolicy")), user)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    server = start(
        tmp_path / "certs",
        "--kube",
        "kubeconfig",
        "--no-controller",
        env={"KUBECONFIG": str(kubeconfig)},
        metrics_port=free_port(),
    )
    try:
        run = JobRun.store(api, admitted_job(IGNORE))
        dry = run.new_pod()
        answer = server.review("/validate", deletion(copy.deepcopy(dry), dry_run=True))
        assert answer["response"]["allowed"] is True
        pod = run.new_pod()
        api.requests.clear()
        started = time.monotonic()
        answer = server.review("/validate", deletion(copy.deepcopy(pod), grace=30))
        assert answer["response"] == {"uid": answer["response"]["uid"], "allowed": True}
        assert time.monotonic() - started < scaled(1.0)
        with api.lock:
            api.delete_pod("ml", pod["metadata"]["name"], 30)
            api.delete_pod("ml", dry["metadata"]["name"], 30)
        eventually(lambda: fp.DISRUPTION_TARGET in conditions(run.current(pod)), 10)
        run.fail(pod)
        assert run.judge(pod) == "Ignore"
        samples = eventually(
            lambda: (
                (s := server.metrics())
                and s.get(("retry_webhook_deletions_recognized_total", (("result", "marked"),)))
                and s
            ),
            15,
        )
        assert samples[("retry_webhook_deletions_recognized_total", (("result", "marked"),))] == 1
        assert fp.DISRUPTION_TARGET not in conditions(run.current(dry))  # marked: one, not it
    finally:
        stop(server)
    made = {c for c in calls(list(api.requests)) if c.resource.startswith(("pods", "events"))}
    assert {(c.verb, c.resource) for c in made} >= {("get", "pods"), ("patch", "pods/status")}
    docs = render(tool("helm"), {})
    account = deployment_pod(docs)["spec"]["serviceAccountName"]
    assert denied(docs, account, CHART_NS, made) == []
    assert api.refused == []
    # Its pod writes are the marks' (testkit/rbac.py), granted while they are on.
    from testkit.rbac import POD_WRITES, combinations

    pod_writes = {(c.verb, c.resource) for c in made if c.verb in ("patch", "delete")}
    assert pod_writes == POD_WRITES["deletions"]
    for name, values, on in combinations():
        if "deletions" in on:
            assert denied(render(tool("helm"), values), account, CHART_NS, made) == [], name
