"""``retry-webhook status`` for the budgets per cause (issue 33): ``max-disruptions``,
``max-in-place-restarts``, disruptions by deletion and ``peer-disruptions``.

The cluster is built as in tests/status/test_status.py (workloads and pods admitted by the
webhook's engine, the Job controller's pods, the kubelet's failures), and what the
webhook and its controller write is written by their own code against the test API: a
disruptor's DELETE judged by the validating webhook (``webhook.admission.deletions``) and
the pod marked by ``DeletionMarker``; disruptions counted, the record written and peers
marked by ``Disruptions``; a pod replaced by ``InPlaceBudget``; their Events by the
``EventRecorder``. The Job controller's judgement of each failed pod is ``JobRun.judge``
(testkit/jobsim.py: the podFailurePolicy evaluation, as ``matchPodFailurePolicy``).
"""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

from testkit.builders import P
from testkit.clusters import (
    NS,
    T0,
    at_minute,
    controller_pod,
    job_manifest,
    jobset_cluster,
    run,
    store_job,
    tree,
)
from testkit.controllers import Running, disruptions, in_place
from testkit.deletions import KARPENTER, deletion, marker, verdict_of
from testkit.jobsim import JobRun
from testkit.servers import eventually
from webhook.admission import engine
from webhook.cluster.record import Record
from webhook.kinds.registry import apply_defaults
from webhook.kube import failurepolicy as fp
from webhook.kube.versions import KubeVersion
from webhook.policy.config import Config, parse_config
from webhook.status.render import render_text, to_json
from webhook.status.story import tell

V136 = Config(kubernetes_version=KubeVersion.parse("1.36"))
DISRUPTIONS = {
    P + "ignore-disruptions": "true",
    P + "max-disruptions": "2",
    P + "backoff-limit": "2",
}


def running(api, pod: dict[str, Any], node: str) -> dict[str, Any]:
    """The pod stored, scheduled on ``node`` and running (the kubelet's status)."""
    out = copy.deepcopy(pod)
    out["metadata"]["uid"] = str(uuid.uuid4())
    out["spec"]["nodeName"] = node
    out["status"] = {
        "phase": "Running",
        "startTime": T0,
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": T0}],
        "containerStatuses": [
            {
                "name": c["name"],
                "ready": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": T0}},
            }
            for c in out["spec"]["containers"]
        ],
    }
    api.put("pods", out)
    return out


def current(api, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as stored now (with what the controller wrote on it)."""
    with api.lock:
        return copy.deepcopy(api.objects[resource][obj["metadata"]["uid"]])


def deleted_by_karpenter(api, marks, pod: dict[str, Any]) -> None:
    """Karpenter deletes the pod: the validating webhook judges the DELETE, the API server
    stores it (``deletionTimestamp``: the Job's finalizer keeps the pod), the worker
    marks it ``DisruptionTarget`` (DeletionByDisruptor)."""
    verdict = verdict_of(deletion(pod, grace=30))
    assert verdict.deleted is not None
    with api.lock:
        api.delete_pod(NS, pod["metadata"]["name"], 30)
    assert marks.mark(verdict.deleted) == "marked"


def counted(reconciler, run: JobRun, pod: dict[str, Any]) -> None:
    """The leader's turn on a disrupted pod: counted against max-disruptions (and marked
    past it), the count written to the workload's record."""
    reconciler.count(run.current(pod))
    reconciler.flush()


def disrupted_job(api, tmp_path):
    """max-disruptions 2, backoffLimit 2. Disruption 1: preempted, ignored, gone (a
    deleted pod goes once judged). Disruption 2: Karpenter's deletion, recognised,
    ignored, gone. Disruption 3: the kubelet's node-pressure eviction (the pod stays):
    over the budget, marked, counted. Disruption 4: Karpenter's deletion, over the budget,
    the pod still terminating. A fifth pod runs."""
    job = store_job(api, job_manifest("train", DISRUPTIONS), {})
    jobrun = JobRun.store(api, job)
    reconciler = disruptions(api, tmp_path)
    marks = marker(api, tmp_path)
    pods = [running(api, controller_pod(job, 0, at_minute(n)), f"spot-{n}") for n in range(5)]
    first, second, third, fourth, _ = pods
    jobrun.disrupt(first, "PreemptionByScheduler")
    counted(reconciler, jobrun, first)
    jobrun.fail(first)
    assert jobrun.judge(first) == "Ignore"
    deleted_by_karpenter(api, marks, second)
    counted(reconciler, jobrun, second)
    jobrun.fail(second)
    assert jobrun.judge(second) == "Ignore"
    jobrun.disrupt(third, "TerminationByKubelet", delete=False)
    counted(reconciler, jobrun, third)
    jobrun.fail(third)
    assert jobrun.judge(third) == "Count"
    deleted_by_karpenter(api, marks, fourth)
    counted(reconciler, jobrun, fourth)
    assert api.pod(first["metadata"]["uid"]) is None  # judged and deleted
    assert api.pod(second["metadata"]["uid"]) is None
    job = current(api, "jobs", job)
    job["status"] = {"startTime": T0, "active": 1, "failed": 1, "terminating": 1}
    api.put("jobs", job)
    assert reconciler.events.flush() and marks.events.flush()
    return job, pods


def test_disruptions_used_against_max_disruptions_and_what_each_pod_got(cluster, tmp_path):
    api, kubeconfig = cluster
    job, (first, second, third, fourth, fifth) = disrupted_job(api, tmp_path)
    # The count the controller wrote on the Job (the first two pods are gone).
    assert Record.of(job).disruptions_of() == 4
    done = run(kubeconfig, "job/train", "-n", NS, "-o", "json")
    assert done.returncode == 0, done.stderr
    story = json.loads(done.stdout)
    (told,) = story["jobs"]
    budgets = {b["field"]: b for b in told["budgets"]}
    assert (budgets["spec.backoffLimit"]["limit"], budgets["spec.backoffLimit"]["used"]) == (2, 1)
    spent = budgets[P + "max-disruptions"]
    assert (spent["limit"], spent["used"], spent["free"], spent["counted"]) == (2, 4, 2, 2)
    assert (spent["index"], spent["next"], spent["object"]) == (None, "counted", "Job train")
    attempts = {a["pod"]: a for a in told["attempts"]}
    # Judged and deleted: in the count only.
    assert first["metadata"]["name"] not in attempts
    assert second["metadata"]["name"] not in attempts
    over = attempts[third["metadata"]["name"]]
    assert over["disruption"] == "TerminationByKubelet" and over["counted"] is True
    # upstream: matchPodFailurePolicy (pkg/controller/job/pod_failure_policy.go): the Count
    # rule on DisruptionBudgetExhausted comes before the Ignore rule on DisruptionTarget.
    assert over["rule"] == {"index": 0, "action": "Count"}
    assert over["disruptionBudget"] == {
        "result": "counted",
        "limit": 2,
        "number": 3,
        "marked": True,
        "late": None,
    }
    assert over["deletedBy"] is None
    reclaimed = attempts[fourth["metadata"]["name"]]
    assert reclaimed["phase"] == "Terminating" and reclaimed["deletedBy"] == KARPENTER
    assert reclaimed["disruptionBudget"]["result"] == "counted"
    assert reclaimed["disruptionBudget"]["number"] == 4
    new = attempts[fifth["metadata"]["name"]]
    assert (new["deletedBy"], new["disruptionBudget"], new["peerDisrupted"]) == (None,) * 3
    reasons = {e["reason"] for e in story["events"]}
    assert {"RetryDisruptionCounted", "RetryDisruptionRecognized"} <= reasons
    # The plan tells the rule on DisruptionBudgetExhausted as the webhook's.
    origins = [r["origin"] for r in story["plan"]["items"][0]["rules"]]
    assert origins[:2] == [
        "added by retry-policy for max-disruptions",
        "added by retry-policy for ignore-disruptions",
    ]
    text = run(kubeconfig, "job/train", "-n", NS).stdout
    assert max(len(line) for line in text.splitlines()) <= 80
    flat = " ".join(text.split())
    assert (
        "max-disruptions 2: 4 disruptions counted: 2 free, 2 counted against the retry budget"
    ) in flat
    assert (
        "disrupted (TerminationByKubelet; trainer exited 143); counted (rule 1 (Count)); "
        "disruption 3, over max-disruptions 2: counted against the retry budget"
    ) in flat
    assert f"deleted by {KARPENTER}, a disruptor: marked a disruption by retry-policy" in flat
    assert (
        "Next disruption: counted: disruption 5, over max-disruptions 2: the controller marks "
        f"its pod {fp.DISRUPTION_BUDGET_EXHAUSTED}"
    ) in flat


def test_a_free_disruption_and_the_next_one_free(cluster, tmp_path):
    """One disruption of two: the pod counted free (the record's mark), the next free."""
    api, kubeconfig = cluster
    job = store_job(api, job_manifest("train", DISRUPTIONS), {})
    jobrun = JobRun.store(api, job)
    reconciler = disruptions(api, tmp_path)
    pod = running(api, controller_pod(job, 0, at_minute(0)), "spot-0")
    deleted_by_karpenter(api, marker(api, tmp_path), pod)
    counted(reconciler, jobrun, pod)
    unseen = running(api, controller_pod(job, 0, at_minute(1)), "spot-1")
    jobrun.disrupt(unseen, "EvictionByEvictionAPI")  # the controller has not counted it yet
    story = json.loads(run(kubeconfig, "job/train", "-n", NS, "-o", "json").stdout)
    (told,) = story["jobs"]
    spent = next(b for b in told["budgets"] if b["field"] == P + "max-disruptions")
    assert (spent["used"], spent["free"], spent["counted"], spent["next"]) == (1, 1, 0, "free")
    attempts = {a["pod"]: a for a in told["attempts"]}
    free = attempts[pod["metadata"]["name"]]["disruptionBudget"]
    assert free == {"result": "free", "limit": 2, "number": None, "marked": False, "late": None}
    assert attempts[unseen["metadata"]["name"]]["disruptionBudget"]["result"] is None
    flat = " ".join(run(kubeconfig, "job/train", "-n", NS).stdout.split())
    assert "a free disruption (max-disruptions 2)" in flat
    assert "not counted against max-disruptions 2 by the controller (yet)" in flat
    assert "Next disruption: free: disruption 2 of the 2 max-disruptions allows" in flat


def test_a_pod_counted_over_but_judged_before_its_mark_says_so(cluster, tmp_path):
    """The third disruption's pod failed and was judged (Ignore) before the controller got
    to it; the controller counts it over the budget, writes no condition, and lowers the
    Job's backoffLimit instead. Status says so: over in the count, ignored by the rules,
    counted by the lowered backoffLimit."""
    api, kubeconfig = cluster
    job = store_job(api, job_manifest("train", DISRUPTIONS), {})
    jobrun = JobRun.store(api, job)
    reconciler = disruptions(api, tmp_path)
    for n in range(2):
        pod = running(api, controller_pod(job, 0, at_minute(n)), f"spot-{n}")
        jobrun.disrupt(pod)
        counted(reconciler, jobrun, pod)
        jobrun.fail(pod)
        assert jobrun.judge(pod) == "Ignore"  # free; judged, the deleted pod goes
    late = running(api, controller_pod(job, 0, at_minute(3)), "spot-3")
    jobrun.disrupt(late, "TerminationByKubelet", delete=False)
    jobrun.fail(late)
    assert jobrun.judge(late) == "Ignore"  # the kubelet's eviction deletes nothing: it stays
    counted(reconciler, jobrun, late)
    assert fp.DISRUPTION_BUDGET_EXHAUSTED not in json.dumps(jobrun.current(late))
    story = json.loads(run(kubeconfig, "job/train", "-n", NS, "-o", "json").stdout)
    (attempt,) = story["jobs"][0]["attempts"]
    assert attempt["counted"] is False
    assert attempt["disruptionBudget"] == {
        "result": "counted",
        "limit": 2,
        "number": None,
        "marked": False,
        "late": "lowered",
    }
    flat = " ".join(run(kubeconfig, "job/train", "-n", NS).stdout.split())
    assert (
        "not counted: rule 2 (Ignore); over max-disruptions 2, failed before it could be "
        "marked: counted by the controller lowering backoffLimit by one"
    ) in flat
    assert current(api, "jobs", job)["spec"]["backoffLimit"] == 1


def test_a_finished_job_says_no_next_disruption(cluster, tmp_path):
    api, kubeconfig = cluster
    job, _ = disrupted_job(api, tmp_path)
    job["status"]["conditions"] = [
        {"type": t, "status": "True", "reason": "BackoffLimitExceeded", "message": "m"}
        for t in ("FailureTarget", "Failed")
    ]
    api.put("jobs", job)
    story = json.loads(run(kubeconfig, "job/train", "-n", NS, "-o", "json").stdout)
    spent = next(b for b in story["jobs"][0]["budgets"] if b["field"] == P + "max-disruptions")
    assert (spent["used"], spent["next"]) == (4, None)
    assert "Next disruption" not in run(kubeconfig, "job/train", "-n", NS).stdout


def test_an_indexed_job_counts_disruptions_per_index(cluster, tmp_path):
    """backoffLimitPerIndex: the controller counts each index's disruptions (its pods
    carry job-index-failure-count: ``addIndexFailureCountAnnotation``)."""
    api, kubeconfig = cluster
    manifest = job_manifest(
        "shards", {P + "ignore-disruptions": "true", P + "max-disruptions": "1"}
    )
    manifest["spec"].update(
        completionMode="Indexed", completions=3, parallelism=3, backoffLimitPerIndex=1
    )
    job = store_job(api, manifest, {"active": 3})
    jobrun = JobRun.store(api, job)
    reconciler = disruptions(api, tmp_path)
    for index in (0, 1, 0):
        pod = jobrun.new_pod(index, 0)
        jobrun.disrupt(pod)
        counted(reconciler, jobrun, pod)
    story = json.loads(run(kubeconfig, "job/shards", "-n", NS, "-o", "json").stdout)
    spent = [b for b in story["jobs"][0]["budgets"] if b["field"] == P + "max-disruptions"]
    told = [(b["index"], b["used"], b["free"], b["counted"], b["next"]) for b in spent]
    assert told == [(0, 2, 1, 1, "counted"), (1, 1, 1, 0, "counted")]
    flat = " ".join(run(kubeconfig, "job/shards", "-n", NS).stdout.split())
    assert "max-disruptions 1, index 0: 2 disruptions counted: 1 free, 1 counted" in flat
    assert "of index 1: counted: disruption 2, over max-disruptions 1" in flat
    assert "of an index not listed: free (each index's first 1 are)" in flat


def test_a_jobset_counts_its_disruptions_and_fails_the_disrupted_job_once(cluster, tmp_path):
    """The set's budget (its record, across its Jobs), and peer-disruptions on a JobSet: a
    worker evicted, the controller marks no peer pod but writes one FailureTarget on the
    worker's Job (``webhook.kinds.jobset.peers``: ``syncJob`` fails a Job with it,
    ``newFailedConditionForFailureTarget``), which the JobSet's first rule,
    retryPolicyPeerDisruptions, restarts the set on; status tells that Job's failure as
    the controller's, for peer-disruptions."""
    api, kubeconfig = cluster
    annotations = {P + "max-disruptions": "1", P + "peer-disruptions": "ignore"}
    status = {"restarts": 1, "restartsCountTowardsMax": 1}
    jobset, jobs = jobset_cluster(api, status, {"active": 1}, annotations)
    leader = next(j for j in jobs if "leader" in j["metadata"]["name"])
    workers = next(j for j in jobs if "workers" in j["metadata"]["name"])
    evicted = running(api, controller_pod(workers, 0, at_minute(0)), "spot-0")
    peer = running(api, controller_pod(leader, 0, at_minute(0)), "node-a")
    evicted_run = JobRun(api, workers)

    def failure_target() -> dict[str, Any] | None:
        conditions = current(api, "jobs", workers).get("status", {}).get("conditions") or []
        return next((c for c in conditions if c.get("type") == "FailureTarget"), None)

    with Running(disruptions(api, tmp_path)) as reconciler:
        evicted_run.disrupt(evicted, "EvictionByEvictionAPI")
        eventually(failure_target, 10)
        eventually(lambda: Record.of(current(api, "jobsets", jobset)), 10)
        reconciler.events.flush()
    target = failure_target()
    assert target["reason"] == "PodFailurePolicy"
    assert target["message"].startswith("retry-policy.dev/PeerDisrupted: ")
    conditions = api.pod(peer["metadata"]["uid"])["status"].get("conditions") or []
    assert fp.PEER_DISRUPTED not in [c["type"] for c in conditions]  # no pod marked
    done = run(kubeconfig, "jobset/llm-pretrain", "-n", NS, "-o", "json")
    assert done.returncode == 0, done.stderr
    story = json.loads(done.stdout)
    spent = next(b for b in story["budgets"] if b["field"] == P + "max-disruptions")
    assert spent["object"] == f"JobSet {jobset['metadata']['name']}"
    assert (spent["limit"], spent["used"], spent["free"], spent["next"]) == (1, 1, 1, "counted")
    attempts = {a["pod"]: a for j in story["jobs"] for a in j["attempts"]}
    assert attempts[evicted["metadata"]["name"]]["disruptionBudget"]["result"] == "free"
    # No Job of the set says a budget of its own: the set's is the one counted.
    assert all(b["field"] != P + "max-disruptions" for j in story["jobs"] for b in j["budgets"])
    assert any(e["reason"] == "RetryDisruptionCounted" for e in story["events"])
    # The rules on the controller's conditions, in each replicated Job, are the webhook's.
    assert not any("would change it" in n or "stored rules" in n for n in story["notes"])
    assert len(story["plan"]["items"]) == 3  # the JobSet, then each replicated Job
    flat = " ".join(run(kubeconfig, "jobset/llm-pretrain", "-n", NS).stdout.split())
    assert "Next disruption: counted: disruption 2, over max-disruptions 1" in flat


IN_PLACE = {
    P + "in-place-exit-codes": "42",
    P + "max-in-place-restarts": "3",
    P + "backoff-limit": "2",
}


def test_restarts_in_place_against_max_in_place_restarts(cluster, tmp_path):
    """A pod whose container restarted in place 3 times is marked by the controller and
    its deadline set to end it (the kubelet has not stopped it yet); another runs after
    one restart."""
    api, kubeconfig = cluster
    job = store_job(api, job_manifest("train", IN_PLACE), {"active": 1}, V136)
    jobrun = JobRun.store(api, job)
    spent = running(api, controller_pod(job, 0, at_minute(0)), "node-a")
    jobrun.restart(spent, 3)
    reconciler = in_place(api, tmp_path)
    assert reconciler.replace(jobrun.current(spent)) is True
    assert reconciler.events.flush()
    again = running(api, controller_pod(job, 0, at_minute(5)), "node-b")
    jobrun.restart(again, 1)
    story = json.loads(run(kubeconfig, "job/train", "-n", NS, "-o", "json").stdout)
    (told,) = story["jobs"]
    attempts = {a["pod"]: a for a in told["attempts"]}
    replaced = attempts[spent["metadata"]["name"]]
    assert replaced["phase"] == "Running"
    assert api.pod(spent["metadata"]["uid"])["spec"]["activeDeadlineSeconds"] == 1
    assert replaced["inPlace"] == {"restarts": 3, "limit": 3, "replaced": True}
    assert attempts[again["metadata"]["name"]]["inPlace"] == {
        "restarts": 1,
        "limit": 3,
        "replaced": False,
    }
    (budget,) = [b for b in told["budgets"] if b["field"] == P + "max-in-place-restarts"]
    assert (budget["object"], budget["limit"], budget["used"]) == (
        f"Pod {again['metadata']['name']}",
        3,
        1,
    )
    assert any(e["reason"] == "RetryInPlaceBudgetExhausted" for e in story["events"])
    # The plan is judged for the cluster's version (its /version: 1.36 here), as the
    # webhook judged the Job: the rule on InPlaceBudgetExhausted is the webhook's.
    assert not any("would change it" in n for n in story["notes"]), story["notes"]
    (first_rule, *_) = story["plan"]["items"][0]["rules"]
    assert first_rule["origin"] == "added by retry-policy for max-in-place-restarts"
    flat = " ".join(run(kubeconfig, "job/train", "-n", NS).stdout.split())
    assert "replaced after 3 restarts in place of max-in-place-restarts 3" in flat
    assert "1 restart in place of max-in-place-restarts 3 used" in flat
    assert (
        f"max-in-place-restarts 3, pod {again['metadata']['name']}: 1 restart in place, 2 left "
        "before the controller replaces the pod"
    ) in flat
    # Past its deadline the kubelet stops it (SIGTERM) and fails it, DeadlineExceeded: the
    # Count rule on InPlaceBudgetExhausted counts it (upstream: matchPodFailurePolicy),
    # before FailJob.
    failed = jobrun.terminate(spent, 143)
    assert failed["status"]["reason"] == "DeadlineExceeded"
    pods = [failed, api.pod(again["metadata"]["uid"])]
    later = tell(tree(current(api, "jobs", job), pods))
    (attempt, _) = later.jobs[0].attempts
    assert (attempt.counted, attempt.action, attempt.rule) == (True, "Count", 0)
    assert to_json(later)["jobs"][0]["attempts"][0]["inPlace"]["replaced"] is True
    assert "counted (rule 1 (Count)); replaced after 3 restarts in place" in " ".join(
        render_text(later).split()
    )


def test_admin_defaults_of_the_budgets_are_told_as_cluster_defaults():
    defaults = parse_config(
        "defaults: {ignore-disruptions: 'true', max-disruptions: '3', peer-disruptions: count}"
    )
    obj = job_manifest("plain", {})
    obj["metadata"]["namespace"] = NS
    apply_defaults(obj)
    verdict, job = engine.review_object(obj, defaults, NS)
    assert verdict.allowed
    job["metadata"]["uid"] = "uid-plain"
    story = tell(tree(job))
    (plan,) = story.explained
    told = {s.name: (s.value, s.source) for s in plan.settings}
    assert told["max-disruptions"] == ("3", "cluster default")
    assert told["peer-disruptions"] == ("count", "cluster default")
    assert [r.origin for r in plan.rules] == [
        "added by retry-policy for max-disruptions",
        "added by retry-policy for peer-disruptions",
        "added by retry-policy for ignore-disruptions",
    ]
    (budget,) = [b for b in story.jobs[0].budgets if b.field == P + "max-disruptions"]
    assert (budget.limit, budget.used) == (3, 0)


def test_without_the_clusters_version_in_place_is_judged_for_the_assumed_one(cluster):
    """/version unanswered: the plan is judged for 1.36 (what the offline commands assume),
    and a note says so, rather than a plan that reads the Job as one the webhook denies."""
    api, kubeconfig = cluster
    store_job(api, job_manifest("train", IN_PLACE), {"active": 1}, V136)
    api.version_status = 500
    done = run(kubeconfig, "job/train", "-n", NS, "-o", "json")
    assert done.returncode == 0, done.stderr
    story = json.loads(done.stdout)
    assert (
        "the cluster's Kubernetes version was not read: in-place restarts are judged for "
        "Kubernetes 1.36"
    ) in story["notes"]
    assert not any("would change it" in n for n in story["notes"])
