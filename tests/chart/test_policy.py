"""The power of the webhook's ServiceAccount token, stated and narrowed.

- RBAC: the chart grants pod writes only for the parts that are on (the controller, the
  marks of pods disruptors delete: ``testkit/rbac.py``'s combinations of the switches).
- The ValidatingAdmissionPolicy (``templates/admission-policy.yaml``), as the real helm
  renders it: valid against the Kubernetes 1.30 (its first GA release) and 1.37 schemas,
  rendered where the cluster serves it, and evaluated with cel-python (``testkit/vap.py``,
  the API server's way) on the writes the controller's own code makes through the HTTP test
  API (gates released, budgets' conditions, a disruptor's deletion marked, a pod replaced,
  records written) and on the writes it must refuse (an image swap, a label, a nodeName, a
  status rewrite, another condition, a deletion of an unmarked pod...).
"""

from __future__ import annotations

import copy
import json
import re
import time

import kubernetes_validate
import pytest
from kubernetes import client, config

from testkit.builders import P
from testkit.chart import (
    CHART,
    NAMESPACE,
    RELEASE,
    WRITE_VERBS,
    deployment_pod,
    one,
    render,
    render_fails,
    run_helm,
)
from testkit.controllers import IN_PLACE, admitted_job
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.jobsim import JobRun
from testkit.rbac import POD_WRITES, combinations, granted, pod_writes
from testkit.vap import Policy, admitted, gate, request
from webhook.cluster.conditions import add_condition, status_patch
from webhook.cluster.deletions import DeletionMarker
from webhook.cluster.events import REASONS, REPORTING_CONTROLLER, EventRecorder
from webhook.cluster.record import ANNOTATION as HISTORY
from webhook.controller.gates import release_all
from webhook.controller.records import Workloads
from webhook.controller.restarts import InPlaceBudget
from webhook.kinds.registry import WORKLOADS
from webhook.kube import failurepolicy as fp
from webhook.kube import gates

pytestmark = pytest.mark.tools

FULL = f"{RELEASE}-retry-policy-webhook"
WEBHOOK = f"system:serviceaccount:{NAMESPACE}:{FULL}"
HOOK = f"system:serviceaccount:{NAMESPACE}:{FULL}-release-gates"
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"
KUEUE_GATE = {"name": "kueue.x-k8s.io/admission"}
BUDGETS = {
    **IN_PLACE,
    P + "ignore-disruptions": "true",
    P + "max-disruptions": "1",
    P + "peer-disruptions": "ignore",
}
T0 = "2026-11-26T10:00:00Z"


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


def policy_of(docs: list[dict]) -> Policy:
    return Policy(one(docs, "ValidatingAdmissionPolicy"))


@pytest.fixture
def policy(helm) -> Policy:
    return policy_of(render(helm, {}))


def core_of(fake: FakeAPI, tmp_path):
    path = write_kubeconfig(tmp_path / f"kubeconfig-{time.monotonic_ns()}", fake.url)
    return config.new_client_from_config(str(path))


# --- objects as the API server stores them ------------------------------------------------------


def dressed(pod: dict) -> dict:
    """A Job's pod (``testkit/jobsim.py``) with what the API server and the kubelet add to a
    stored, running pod: its generation, managed fields, QoS class, addresses, start."""
    pod = copy.deepcopy(pod)
    meta = pod["metadata"]
    meta.setdefault("creationTimestamp", T0)
    meta["generation"] = 1
    meta["managedFields"] = [
        {
            "manager": "kube-controller-manager",
            "operation": "Update",
            "apiVersion": "v1",
            "time": T0,
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {}}, "f:spec": {}},
        },
        {
            "manager": "kubelet",
            "operation": "Update",
            "apiVersion": "v1",
            "time": T0,
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:status": {"f:conditions": {}}},
            "subresource": "status",
        },
    ]
    pod["spec"].setdefault("terminationGracePeriodSeconds", 30)
    pod["spec"].setdefault(
        "tolerations",
        [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
    )
    status = pod["status"]
    for cs, container in zip(status["containerStatuses"], pod["spec"]["containers"], strict=True):
        cs.update(
            image=container["image"],
            imageID=f"docker.io/library/{container['image']}@sha256:{'4' * 64}",
            containerID=f"containerd://{'c' * 64}",
            ready=True,
            started=True,
        )
    status.update(
        {"qosClass": "BestEffort", "hostIP": "10.0.3.7", "podIP": "10.244.3.12", "startTime": T0}
    )
    status["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": T0},
        {"type": "Initialized", "status": "True", "lastTransitionTime": T0},
        {"type": "Ready", "status": "True", "lastTransitionTime": T0},
    ]
    return pod


def stored_pod(fake: FakeAPI, annotations: dict | None = None, gated: bool = False) -> dict:
    """A running pod of a Job admitted with ``annotations`` (the budgets' by default), as
    stored; ``gated``: held back by our retry-delay gate behind Kueue's."""
    run = JobRun.store(fake, admitted_job(BUDGETS if annotations is None else annotations))
    pod = dressed(run.new_pod())
    if gated:
        pod["spec"].pop("nodeName")
        pod["spec"]["schedulingGates"] = [KUEUE_GATE]
        assert gates.add_gate(pod, "2026-11-26T10:01:00Z")
        pod["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    fake.put("pods", pod)
    return fake.pod(pod["metadata"]["uid"])


def review(policy: Policy, user: str, operation: str, resource: str, sub: str, new, old):
    """The policy's verdict on a write as the API server would admit it."""
    obj = admitted(resource, sub, new, old) if new is not None and old is not None else new
    meta = (old or new)["metadata"]
    return policy.review(
        request(user, operation, resource, sub, meta["name"], meta["namespace"]), obj, old
    )


# --- RBAC: pod writes only for the parts that are on --------------------------------------------


@pytest.mark.parametrize(("to", "allowed"), [(5, True), (3, True), (0, True), (6, False)])
def test_a_job_s_budget_may_be_lowered_by_several_in_one_write(api, policy, to, allowed):
    """A node that takes several pods of a Job past its ``max-disruptions`` makes the
    controller lower ``backoffLimit`` by as many in one write (``webhook/controller/
    disruptions.py``); upstream's ``ValidateJobSpecUpdate`` allows any change of it, the
    policy any lowering and no raise."""
    old = a_job(api)
    old["spec"]["backoffLimit"] = 5
    new = _edit("spec.backoffLimit", to)(RECORD(old))
    judged(review(policy, WEBHOOK, "UPDATE", "jobs", "", new, old), [] if allowed else ["backoff"])


@pytest.mark.parametrize(
    ("name", "values", "on"), combinations(), ids=[c[0] for c in combinations()]
)
def test_pod_writes_are_granted_only_for_the_parts_that_are_on(helm, name, values, on):
    docs = render(helm, values)
    account = deployment_pod(docs)["spec"]["serviceAccountName"]
    rules = granted(docs, account, NAMESPACE)
    writes = {
        (verb, resource)
        for _, rule in rules
        for resource in rule["resources"]
        for verb in rule["verbs"]
        if verb in WRITE_VERBS
    }
    assert {w for w in writes if w[1].startswith("pods")} == pod_writes(on), name
    workloads = {("patch", "jobs"), ("patch", "jobsets")}
    assert writes & workloads == (workloads if "controller" in on else set()), name


def test_without_a_cluster_the_webhook_identity_gets_nothing(helm):
    docs = render(helm, {"server": {"kube": "off"}})
    assert granted(docs, FULL, NAMESPACE) == []


# --- the policy's objects ------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.30", "1.37"])
def test_the_policy_and_its_binding_are_valid_kubernetes(helm, version):
    """``admissionregistration.k8s.io/v1`` ValidatingAdmissionPolicy is GA from 1.30, the
    chart's kubeVersion floor."""
    for values in ({}, {"controller": {"enabled": False}}, {"server": {"kube": "off"}}):
        docs = render(helm, values)
        for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
            kubernetes_validate.validate(one(docs, kind), version, strict=True)


def test_the_binding_denies_with_the_policy_for_the_release(helm):
    docs = render(helm, {})
    policy, binding = (
        one(docs, "ValidatingAdmissionPolicy"),
        one(docs, "ValidatingAdmissionPolicyBinding"),
    )
    assert policy["metadata"]["name"] == binding["metadata"]["name"] == f"{FULL}-writes"
    assert "namespace" not in policy["metadata"]  # cluster-scoped
    assert binding["spec"] == {"policyName": f"{FULL}-writes", "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert [c["expression"] for c in policy["spec"]["matchConditions"]] == [
        f"request.userInfo.username in ['{WEBHOOK}', '{HOOK}']"
    ]
    audit = render(helm, {"rbac": {"admissionPolicy": {"validationActions": ["Warn", "Audit"]}}})
    assert one(audit, "ValidatingAdmissionPolicyBinding")["spec"]["validationActions"] == [
        "Warn",
        "Audit",
    ]
    off = render(helm, {"rbac": {"admissionPolicy": {"enabled": False}}})
    assert not [d for d in off if d["kind"].startswith("ValidatingAdmissionPolicy")]
    # Its own ServiceAccount's name, however it is given.
    named = render(helm, {"serviceAccount": {"create": False, "name": "shared"}})
    (condition,) = one(named, "ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    assert f"'system:serviceaccount:{NAMESPACE}:shared'" in condition["expression"]


@pytest.mark.parametrize("actions", [["Deny", "Warn"], [], ["Block"], ["Audit", "Audit"]], ids=str)
def test_the_schema_refuses_validation_actions_kubernetes_refuses(helm, actions):
    # upstream: validateValidationActions (pkg/apis/admissionregistration/validation/validation.go)
    stderr = render_fails(helm, {"rbac": {"admissionPolicy": {"validationActions": actions}}})
    assert "validationActions" in stderr


def _kinds(helm_path: str, *args: str) -> set[str]:
    result = run_helm(helm_path, "template", RELEASE, str(CHART), "-n", NAMESPACE, *args)
    assert result.returncode == 0, result.stderr
    return {
        line.split(":", 1)[1].strip()
        for line in result.stdout.splitlines()
        if line.startswith("kind:")
    }


def test_the_policy_is_rendered_where_the_cluster_serves_it(helm):
    """Against a cluster, helm reads the API server's discovery (kinds included,
    ``GetVersionSet`` in helm pkg/action/action.go); `helm template` knows no kinds and
    falls back to the Kubernetes version."""
    vap = "ValidatingAdmissionPolicy"
    assert vap in _kinds(helm)
    assert vap in _kinds(helm, "--kube-version", "1.30.0")
    # A cluster whose discovery lists no ValidatingAdmissionPolicy (switched off).
    assert vap not in _kinds(helm, "--api-versions", "v1/Pod")
    served = (
        "--api-versions",
        "v1/Pod",
        "--api-versions",
        f"admissionregistration.k8s.io/v1/{vap}",
    )
    assert vap in _kinds(helm, *served)


# --- the policy's verdicts ------------------------------------------------------------------------


def test_other_users_are_not_evaluated(api, policy):
    pod = stored_pod(api)
    swapped = copy.deepcopy(pod)
    swapped["spec"]["containers"][0]["image"] = "evil:latest"
    for user in (JOB_CONTROLLER, "system:node:node-1", "alice"):
        verdict = review(policy, user, "UPDATE", "pods", "", swapped, pod)
        assert not verdict.matched and verdict.allowed
    verdict = review(policy, WEBHOOK, "UPDATE", "pods", "", swapped, pod)
    assert verdict.matched and not verdict.allowed


def _labelled(pod: dict, **changes) -> dict:
    pod = copy.deepcopy(pod)
    for key, value in changes.items():
        if value is None:
            pod["metadata"]["labels"].pop(key, None)
        else:
            pod["metadata"]["labels"][key] = value
    return pod


def _spec(**fields):
    def change(pod: dict) -> dict:
        pod = copy.deepcopy(pod)
        pod["spec"].update(fields)
        return pod

    return change


def _edit(path: str | tuple[str, ...], value):
    """Set the field at ``path`` (dotted, or the keys; list indexes as numbers); ``None``
    removes it."""

    def change(obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        *parents, last = path.split(".") if isinstance(path, str) else path
        node = obj
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if isinstance(node, list):
            node[int(last)] = value
        elif value is None:
            node.pop(last, None)
        else:
            node[last] = value
        return obj

    return change


def _released(pod: dict) -> dict:
    import jsonpatch

    return jsonpatch.apply_patch(pod, gates.release_patch(pod))


def _condition(kind: str, reason: str = "Reason", status: str = "True"):
    def change(pod: dict) -> dict:
        pod = copy.deepcopy(pod)
        body = status_patch(kind, reason, "message", 0)["status"]["conditions"][0]
        body["status"] = status
        kept = [c for c in pod["status"]["conditions"] if c["type"] != kind]
        pod["status"]["conditions"] = [*kept, body]
        return pod

    return change


def _terminating(pod: dict) -> dict:
    pod = copy.deepcopy(pod)
    pod["metadata"]["deletionTimestamp"] = "2026-11-26T10:00:30Z"
    pod["metadata"]["deletionGracePeriodSeconds"] = 30
    return pod


WHERE = {
    "gates": "spec.schedulingGates",
    "labels": "only its gate label",
    "deadline": "activeDeadlineSeconds",
    "pod": "nothing else of a pod",
    "conditions": "may only gain its own conditions",
    "status": "may change nothing but conditions",
    "annotations": "only its record",
    "backoff": "backoffLimit may only be lowered",
    "workload": "nothing else of a workload",
    "action": "may not ",
    "event": "an Event must be its own",
    "series": "only its series",
    "jobstatus": "of a Job's status, only FailureTarget",
}

HISTORY_PATH = ("metadata", "annotations", HISTORY)


def case(name, stored, change, denied=(), *, user=WEBHOOK, op="UPDATE", sub="", kind="pods"):
    """A write of ``user`` to the object ``stored`` names (see ``_objects``), changed by
    ``change``, and the validations that deny it (``WHERE``'s keys; none: allowed)."""
    return pytest.param(user, op, kind, sub, stored, change, list(denied), id=name)


def status(name, stored, change, denied=(), **kw):
    return case(name, stored, change, denied, sub="status", **kw)


TARGET = _condition(fp.DISRUPTION_TARGET, "DeletionByDisruptor")
IN_PLACE_DONE = _condition(fp.IN_PLACE_BUDGET_EXHAUSTED)
UNLABEL = {gates.GATED_LABEL: None}
# Pods: "pod" a running pod of a Job with every budget's label, "gated" one held back behind
# Kueue's gate, "plain" one without our labels, "terminating" the pod being deleted,
# "exhausted" it with InPlaceBudgetExhausted, "deadline" it with activeDeadlineSeconds 3600.
CASES = [
    # What the code does: allowed.
    case("release our gate and label", "gated", _released),
    case("the hook releases them too", "gated", _released, user=HOOK),
    case("only the label left", "pod", lambda p: _labelled(p, **UNLABEL)),
    case("set activeDeadlineSeconds", "pod", _spec(activeDeadlineSeconds=1)),
    case("lower activeDeadlineSeconds", "deadline", _spec(activeDeadlineSeconds=60)),
    case("a no-op update", "pod", copy.deepcopy),
    status("InPlaceBudgetExhausted", "pod", IN_PLACE_DONE),
    status("DisruptionBudgetExhausted", "pod", _condition(fp.DISRUPTION_BUDGET_EXHAUSTED)),
    status("PeerDisrupted", "pod", _condition(fp.PEER_DISRUPTED)),
    status("DisruptionTarget on a deletion", "terminating", TARGET),
    status("our condition set again", "exhausted", _condition(fp.IN_PLACE_BUDGET_EXHAUSTED, "A")),
    # Pod updates the code never makes.
    case("swap an image", "pod", _edit("spec.containers.0.image", "evil:latest"), ["pod"]),
    case("move to another node", "pod", _spec(nodeName="node-evil"), ["pod"]),
    case("add a toleration", "pod", _spec(tolerations=[{"operator": "Exists"}]), ["pod"]),
    case("add a label", "pod", lambda p: _labelled(p, app="frontend"), ["labels"]),
    case("change a label", "pod", lambda p: _labelled(p, **{"job-name": "x"}), ["labels"]),
    case("remove a label", "pod", lambda p: _labelled(p, **{"job-name": None}), ["labels"]),
    case(
        "remove a budget label",
        "pod",
        lambda p: _labelled(p, **{P + "max-disruptions": None}),
        ["labels"],
    ),
    case(
        "change an annotation",
        "gated",
        _edit(("metadata", "annotations", gates.NOT_BEFORE), "2099-01-01T00:00:00Z"),
        ["pod"],
    ),
    case("drop the owner", "pod", _edit("metadata.ownerReferences", None), ["pod"]),
    case("drop the finalizer", "pod", _edit("metadata.finalizers", None), ["pod"]),
    case(
        "remove Kueue's gate",
        "gated",
        _edit("spec.schedulingGates", [{"name": gates.GATE}]),
        ["gates"],
    ),
    case("remove every gate", "gated", _edit("spec.schedulingGates", None), ["gates"]),
    case("deadline of a plain pod", "plain", _spec(activeDeadlineSeconds=1), ["deadline"]),
    case("deadline by the hook", "pod", _spec(activeDeadlineSeconds=1), ["deadline"], user=HOOK),
    case("raise the deadline", "deadline", _spec(activeDeadlineSeconds=7200), ["deadline"]),
    # Status writes the code never makes.
    status("relabel through status", "pod", lambda p: _labelled(p, app="x"), ["status"]),
    status("annotate through status", "pod", _edit("metadata.annotations.x", "y"), ["status"]),
    status("fail the pod", "pod", _edit("status.phase", "Failed"), ["status"]),
    status(
        "rewrite a restart count",
        "pod",
        _edit("status.containerStatuses.0.restartCount", 9),
        ["status"],
    ),
    status("make it unready", "pod", _condition("Ready", status="False"), ["conditions"]),
    status("drop the kubelet's conditions", "pod", _edit("status.conditions", []), ["conditions"]),
    status("another condition type", "pod", _condition("example.com/Healthy"), ["conditions"]),
    # A marked peer disrupted itself: its own disruption decides (webhook/controller/peers.py).
    status("PeerDisrupted back to False", "pod", _condition(fp.PEER_DISRUPTED, status="False")),
    status(
        "another of ours, False",
        "pod",
        _condition(fp.DISRUPTION_BUDGET_EXHAUSTED, status="False"),
        ["conditions"],
    ),
    status("our condition, unlabelled pod", "plain", IN_PLACE_DONE, ["conditions"]),
    status("DisruptionTarget on a running pod", "pod", TARGET, ["conditions"]),
    status(
        "DisruptionTarget, upstream's reason",
        "terminating",
        _condition(fp.DISRUPTION_TARGET, "PreemptionByScheduler"),
        ["conditions"],
    ),
    status("DisruptionTarget, no ignore-disruptions", "terminating-plain", TARGET, ["conditions"]),
    status(
        "the hook adds a condition", "pod", _condition(fp.PEER_DISRUPTED), ["action"], user=HOOK
    ),
    # Deletions, and what else a client can ask of pods.
    # No part deletes a pod (a replaced pod ends by its deadline): every DELETE is refused.
    case("delete a pod that used its restarts", "exhausted", None, ["action"], op="DELETE"),
    case("delete an unmarked pod", "pod", None, ["action"], op="DELETE"),
    case("delete a plain pod", "plain", None, ["action"], op="DELETE"),
    case("the hook deletes", "exhausted", None, ["action"], op="DELETE", user=HOOK),
    case("create a pod", None, None, ["action"], op="CREATE"),
    case("evict", None, None, ["action"], op="CREATE", sub="eviction"),
    case("bind", None, None, ["action"], op="CREATE", sub="binding"),
    case("exec", None, None, ["action"], op="CONNECT", sub="exec"),
    case("ephemeral container", "pod", copy.deepcopy, ["action"], sub="ephemeralcontainers"),
    case("resize", "pod", copy.deepcopy, ["action"], sub="resize"),
]


def _objects(fake: FakeAPI) -> dict:
    pod = stored_pod(fake)
    terminating = _terminating(pod)
    exhausted = _condition(fp.IN_PLACE_BUDGET_EXHAUSTED, "MaxInPlaceRestartsReached")(pod)
    plain = stored_pod(fake, {P + "backoff-limit": "2"})
    return {
        "pod": pod,
        "gated": stored_pod(fake, gated=True),
        "plain": plain,
        "terminating": terminating,
        "terminating-plain": _terminating(plain),
        "exhausted": exhausted,
        "deadline": _spec(activeDeadlineSeconds=3600)(pod),
        None: None,
    }


@pytest.mark.parametrize(
    ("user", "operation", "resource", "sub", "stored", "change", "denied"), CASES
)
def test_pod_writes(api, policy, user, operation, resource, sub, stored, change, denied):
    old = _objects(api)[stored]
    new = change(old) if change is not None and old is not None else None
    if old is None:  # a new pod, an Eviction, a Binding, PodExecOptions: not compared
        new = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "ml"}}
    judged(review(policy, user, operation, resource, sub, new, old), denied)


def judged(verdict, denied: list[str]) -> None:
    """``verdict`` allows, or denies by exactly the validations ``denied`` names."""
    assert verdict.matched
    assert len(verdict.denials) == len(denied), verdict.denials
    for key in denied:
        assert any(WHERE[key] in d for d in verdict.denials), verdict.denials


def a_job(fake: FakeAPI) -> dict:
    job = admitted_job(BUDGETS, "trainer")
    job["metadata"]["annotations"][HISTORY] = '{"v":1}'
    job["metadata"]["generation"] = 1
    job["status"] = {"active": 1, "startTime": T0}
    run = JobRun.store(fake, job)
    return copy.deepcopy(run.job)


RECORD = _edit(HISTORY_PATH, '{"v":2}')
JOB_CASES = [
    case("write the record", None, RECORD, kind="jobs"),
    case("lower backoffLimit by one", None, _edit("spec.backoffLimit", 0), kind="jobs"),
    case("both at once", None, lambda j: _edit("spec.backoffLimit", 0)(RECORD(j)), kind="jobs"),
    case("remove the record", None, _edit(HISTORY_PATH, None), ["annotations"], kind="jobs"),
    case(
        "another annotation",
        None,
        _edit("metadata.annotations.x", "y"),
        ["annotations"],
        kind="jobs",
    ),
    case(
        "a policy annotation",
        None,
        _edit(("metadata", "annotations", P + "backoff-limit"), "9"),
        ["annotations"],
        kind="jobs",
    ),
    case("a label", None, _edit("metadata.labels", {"a": "b"}), ["workload"], kind="jobs"),
    case("raise backoffLimit", None, _edit("spec.backoffLimit", 2), ["backoff"], kind="jobs"),
    case("lower it below 0", None, _edit("spec.backoffLimit", -1), ["backoff"], kind="jobs"),
    case("suspend it", None, _edit("spec.suspend", True), ["workload"], kind="jobs"),
    case("a deadline", None, _edit("spec.activeDeadlineSeconds", 1), ["workload"], kind="jobs"),
    # (jobs/status is written for peer-disruptions on a JobSet: only that FailureTarget)
    case("its status", None, _edit("status.failed", 9), ["jobstatus"], kind="jobs", sub="status"),
    case("a JobSet's record", None, RECORD, kind="jobsets"),
    case("a JobSet's spec", None, _edit("spec.suspend", True), ["workload"], kind="jobsets"),
    case("a RayJob's record", None, RECORD, ["action"], kind="rayjobs"),
    case(
        "a CronJob",
        None,
        _edit("metadata.annotations.x", "y"),
        ["action", "annotations"],
        kind="cronjobs",
    ),
]


@pytest.mark.parametrize(
    ("user", "operation", "resource", "sub", "stored", "change", "denied"), JOB_CASES
)
def test_workload_writes(api, policy, user, operation, resource, sub, stored, change, denied):
    old = a_job(api)
    if resource != "jobs":  # the same shape serves: only metadata and spec are compared
        old = {**old, "apiVersion": "x/v1", "kind": "Other", "spec": {"suspend": False}}
    judged(review(policy, user, operation, resource, sub, change(old), old), denied)
    assert not review(policy, WEBHOOK, "CREATE", resource, "", old, None).allowed
    assert not review(policy, WEBHOOK, "DELETE", resource, "", None, old).allowed


@pytest.mark.parametrize(
    ("name", "values", "on"), combinations(), ids=[c[0] for c in combinations()]
)
def test_the_policy_allows_the_writes_of_the_parts_that_are_on(api, helm, name, values, on):
    """RBAC and the policy agree: a part switched off loses its writes in both."""
    policy = policy_of(render(helm, values))
    objects = _objects(api)
    terminating, pod, job = objects["terminating"], objects["pod"], a_job(api)
    marked = _condition(fp.DISRUPTION_TARGET, "DeletionByDisruptor")(terminating)
    writes = [  # (part, RBAC verb, resource, operation, subresource, object, oldObject)
        (
            "controller",
            "patch",
            "pods",
            "UPDATE",
            "",
            _released(objects["gated"]),
            objects["gated"],
        ),
        (
            "controller",
            "patch",
            "pods/status",
            "UPDATE",
            "status",
            _condition(fp.PEER_DISRUPTED)(pod),
            pod,
        ),
        (
            "controller",
            "patch",
            "jobs",
            "UPDATE",
            "",
            _edit(("metadata", "annotations", HISTORY), "{}")(job),
            job,
        ),
        ("deletions", "patch", "pods/status", "UPDATE", "status", marked, terminating),
    ]
    allowed = set()
    for part, verb, resource, operation, sub, new, old in writes:
        kind = resource.split("/")[0]
        verdict = review(policy, WEBHOOK, operation, kind, sub, new, old)
        assert verdict.allowed is (part in on), (name, part, verb, resource, verdict.denials)
        if verdict.allowed and kind == "pods":
            allowed.add((verb, resource))
    assert allowed == pod_writes(on)
    assert {w[0] for w in writes} == set(POD_WRITES)
    # The hook releases gates whatever the switches (it runs when the controller is off).
    gated_pod = objects["gated"]
    assert review(policy, HOOK, "UPDATE", "pods", "", _released(gated_pod), gated_pod).allowed


# --- the code's own writes, through the HTTP test API with the policy in front -------------------


def gated(fake: FakeAPI, policy: Policy, user: str = WEBHOOK) -> FakeAPI:
    fake.admit = gate(policy, user)
    return fake


def test_releasing_gates_passes_as_the_webhook_and_as_the_hook(api, policy, tmp_path):
    """``retry-webhook release-gates`` (the hook's and the controller's ``release``)."""
    first, second = stored_pod(api, gated=True), stored_pod(api, gated=True)
    core = client.CoreV1Api(core_of(api, tmp_path))
    gated(api, policy, HOOK)
    done, errors = release_all(core, "ml")
    assert errors == [] and api.refused == []
    assert sorted(d.result for d in done) == ["released", "released"]
    for pod in (first, second):
        now = api.pod(pod["metadata"]["uid"])
        assert now["spec"]["schedulingGates"] == [KUEUE_GATE]
        assert gates.GATED_LABEL not in now["metadata"]["labels"]
    third = stored_pod(api, gated=True)
    gated(api, policy, WEBHOOK)
    done, errors = release_all(core, "ml")
    assert errors == [] and api.refused == [] and [d.result for d in done] == ["released"]
    assert api.pod(third["metadata"]["uid"])["spec"]["schedulingGates"] == [KUEUE_GATE]


def test_a_pod_that_used_its_restarts_is_marked_and_given_a_deadline(api, policy, tmp_path):
    """``webhook.controller.restarts``: the condition, then the pod's own deadline lowered
    (a pods PATCH the policy allows on a labelled pod); no deletion."""
    pod = stored_pod(api)
    pod["status"]["containerStatuses"][0]["restartCount"] = 5
    api.put("pods", pod)
    api_client = core_of(api, tmp_path)
    events = EventRecorder(client.EventsV1Api(api_client), "test")
    gated(api, policy)
    assert InPlaceBudget(api_client, events).replace(api.pod(pod["metadata"]["uid"]))
    assert api.refused == []
    assert not any(w[0] == "DELETE" for w in api.writes), api.writes
    now = api.pod(pod["metadata"]["uid"])
    assert fp.IN_PLACE_BUDGET_EXHAUSTED in {c["type"] for c in now["status"]["conditions"]}
    assert now["spec"]["activeDeadlineSeconds"] == 1


def test_a_disruptors_deletion_is_marked(api, policy, tmp_path):
    """``webhook.cluster.deletions``: DisruptionTarget on the pod being deleted."""
    from webhook.admission.deletions import Deleted

    pod = stored_pod(api)
    with api.lock:
        api.delete_pod("ml", pod["metadata"]["name"], 30)  # the disruptor's, not ours
    api_client = core_of(api, tmp_path)
    events = EventRecorder(client.EventsV1Api(api_client), "test")
    marker = DeletionMarker(client.CoreV1Api(api_client), events, WORKLOADS, wait=1.0)
    gated(api, policy)
    karpenter = "system:serviceaccount:kube-system:karpenter"
    deleted = Deleted("ml", pod["metadata"]["name"], pod["metadata"]["uid"], karpenter, 30)
    assert marker.mark(deleted) == "marked"
    assert api.refused == []


def test_the_budgets_conditions_are_added(api, policy, tmp_path):
    """Every condition the controller adds goes through ``add_condition``."""
    core = client.CoreV1Api(core_of(api, tmp_path))
    gated(api, policy)
    for kind in (fp.DISRUPTION_BUDGET_EXHAUSTED, fp.PEER_DISRUPTED, fp.IN_PLACE_BUDGET_EXHAUSTED):
        pod = stored_pod(api)
        add_condition(core, pod, status_patch(kind, "Test", "message", time.time()))
        assert kind in {c["type"] for c in api.pod(pod["metadata"]["uid"])["status"]["conditions"]}
    plain = stored_pod(api, {P + "backoff-limit": "2"})
    with pytest.raises(client.ApiException) as refused:
        add_condition(core, plain, status_patch(fp.PEER_DISRUPTED, "Test", "message", 0))
    assert refused.value.status == 403
    assert [(op, res) for op, res, _ in api.refused] == [("UPDATE", "pods/status")]


def test_records_and_a_lowered_backoff_limit_are_written(api, policy, tmp_path):
    api_client = core_of(api, tmp_path)
    job = a_job(api)
    gated(api, policy)
    written = Workloads(api_client).write_record(
        "job", "ml", job["metadata"]["name"], '{"v":2}', job["metadata"]["resourceVersion"]
    )
    assert written["metadata"]["annotations"][HISTORY] == '{"v":2}'
    batch = client.BatchV1Api(api_client)
    name, limit = job["metadata"]["name"], job["spec"]["backoffLimit"]
    batch.patch_namespaced_job(
        name, "ml", {"spec": {"backoffLimit": limit - 1}}, _preload_content=False
    )
    assert api.refused == []
    with pytest.raises(client.ApiException) as refused:
        batch.patch_namespaced_job(
            name, "ml", {"spec": {"backoffLimit": limit + 5}}, _preload_content=False
        )
    assert refused.value.status == 403 and "backoffLimit" in refused.value.body


def test_a_pods_deadline_is_set_and_lowered_only_where_it_may_be(api, policy, tmp_path):
    core = client.CoreV1Api(core_of(api, tmp_path))
    pod, plain = stored_pod(api), stored_pod(api, {P + "backoff-limit": "2"})
    gated(api, policy)
    name = pod["metadata"]["name"]
    for seconds in (600, 60):
        deadline = {"spec": {"activeDeadlineSeconds": seconds}}
        core.patch_namespaced_pod(name, "ml", deadline, _preload_content=False)
    assert api.refused == []
    # Raising it is refused by the API's own validation (ValidatePodUpdate, before any
    # admission: 422); the policy refuses a deadline on a pod not labelled for it (403).
    for target, seconds, code in ((name, 6000, 422), (plain["metadata"]["name"], 1, 403)):
        with pytest.raises(client.ApiException) as refused:
            deadline = {"spec": {"activeDeadlineSeconds": seconds}}
            core.patch_namespaced_pod(target, "ml", deadline, _preload_content=False)
        assert refused.value.status == code
    assert len(api.refused) == 1
    assert api.pod(pod["metadata"]["uid"])["spec"]["activeDeadlineSeconds"] == 60


# --- Events: only ours, about objects in their own namespace -------------------------------------


def an_event(**change) -> dict:
    """An Event as the controller's recorder creates it (``EventRecorder``)."""
    event = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "train.retry-7f3a", "namespace": "ml"},
        "eventTime": "2026-11-22T10:00:00.000000Z",
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": "retry-policy-webhook-7d9f-abcde",
        "action": "Record",
        "reason": "RetryDisruptionCounted",
        "regarding": {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "namespace": "ml",
            "name": "train",
            "uid": "u1",
        },
        "note": "counted",
        "type": "Normal",
    }
    for key, value in change.items():
        event = _edit(key.replace("__", "."), value)(event)
    return event


@pytest.mark.parametrize(
    ("event", "denied"),
    [
        (an_event(), []),
        (an_event(type="Warning", reason="RetryDelaySkipped"), []),
        (an_event(reason="Killing"), ["event"]),
        (an_event(reportingController="kubelet"), ["event"]),
        (an_event(regarding__namespace="kube-system"), ["event"]),
        (an_event(type="Error"), ["event"]),
    ],
    ids=[
        "ours",
        "a warning of ours",
        "another reason",
        "another reporter",
        "another namespace",
        "a type",
    ],
)
def test_the_controller_creates_only_events_of_its_own(policy, event, denied):
    verdict = policy.review(
        request(WEBHOOK, "CREATE", "events", "", event["metadata"]["name"], "ml"), event, None
    )
    judged(verdict, denied)


@pytest.mark.parametrize(
    ("change", "denied"),
    [
        ({"series": {"count": 3, "lastObservedTime": "2026-11-22T10:05:00.000000Z"}}, []),
        ({"note": "something else"}, ["series"]),
        ({"reason": "RetryPolicyAudit"}, ["series"]),
    ],
    ids=["count on its series", "rewrite its note", "change its reason"],
)
def test_the_controller_updates_an_event_only_to_count_on(policy, change, denied):
    old = an_event()
    old["metadata"]["resourceVersion"] = "7"
    new = {**copy.deepcopy(old), **change}
    judged(review(policy, WEBHOOK, "UPDATE", "events", "", new, old), denied)


def test_the_policy_s_reasons_are_the_recorder_s(helm):
    """One list in two languages: the chart's CEL reasons and ``events.REASONS``."""
    validations = one(render(helm, {}), "ValidatingAdmissionPolicy")["spec"]["validations"]
    rendered = " ".join(v["expression"] for v in validations)
    said = re.search(r"variables.obj.reason in (\[[^\]]*\])", rendered)
    assert said is not None
    assert set(json.loads(said.group(1))) == set(REASONS)


# --- the failure verdicts' writes (webhook/controller/verdicts.py, startdeadline.py) ---------

VERDICTS = {
    P + "free-categories": "DeviceFault",
    P + "max-free-failures": "1",
    P + "start-deadline": "10m",
}
CATEGORY = "retry-policy.dev/DeviceFault"


def _unscheduled(pod: dict) -> dict:
    pod = copy.deepcopy(pod)
    pod["spec"].pop("nodeName", None)
    pod["status"] = {
        "phase": "Pending",
        "qosClass": "BestEffort",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
    }
    return pod


def _failed_unscheduled(
    reason: str = "StartDeadline", kind: str = "retry-policy.dev/Unschedulable"
):
    def change(pod: dict) -> dict:
        pod = _condition(kind, reason)(pod)
        pod["status"]["phase"] = "Failed"
        return pod

    return change


def _failed(pod: dict) -> dict:
    return _edit("status.phase", "Failed")(pod)


VERDICT_CASES = [
    status("a category on a watched pod", "watched", _condition(CATEGORY, "DisruptionReason")),
    status("the free budget's condition", "watched", _condition(fp.FREE_BUDGET_EXHAUSTED)),
    status("a category on a failed Job pod", "failed-plain", _condition(CATEGORY, "ExitCode")),
    status(
        "a category taken back",
        "watched",
        _condition(CATEGORY, "DeadlineRefused", status="False"),
    ),
    status("fail an unscheduled pod past its deadline", "unscheduled", _failed_unscheduled()),
    case("end a scheduled pod past its deadline", "watched", _spec(activeDeadlineSeconds=1)),
    # What the code never writes.
    status("a category, not a signal", "watched", _condition(CATEGORY, "Guess"), ["conditions"]),
    status(
        "a category on a running plain pod", "plain", _condition(CATEGORY, "Event"), ["conditions"]
    ),
    status(
        "the free budget's condition, unlabelled",
        "failed-plain",
        _condition(fp.FREE_BUDGET_EXHAUSTED),
        ["conditions"],
    ),
    status(
        "another category back to False",
        "failed-plain",
        _condition(CATEGORY, "DeadlineRefused", status="False"),
        ["conditions"],
    ),
    status("fail it without a category", "unscheduled", _failed, ["status"]),
    status(
        "fail it with another reason",
        "unscheduled",
        _failed_unscheduled("PodCondition"),
        ["status"],
    ),
    status("fail a scheduled pod", "watched", _failed_unscheduled(), ["status"]),
    status(
        "fail an unlabelled unscheduled pod",
        "unscheduled-plain",
        _failed_unscheduled(),
        ["status", "conditions"],
    ),
]


@pytest.mark.parametrize(
    ("user", "operation", "resource", "sub", "stored", "change", "denied"), VERDICT_CASES
)
def test_verdict_writes(api, policy, user, operation, resource, sub, stored, change, denied):
    watched = stored_pod(api, VERDICTS)
    plain = stored_pod(api, {P + "backoff-limit": "2"})
    objects = {
        "watched": watched,
        "plain": plain,
        "failed-plain": _failed(plain),
        "unscheduled": _unscheduled(watched),
        "unscheduled-plain": _unscheduled(plain),
    }
    old = objects[stored]
    judged(review(policy, user, operation, resource, sub, change(old), old), denied)


def test_the_policy_s_signals_are_the_classifier_s(helm):
    """The reasons a category's condition may give: the chart's CEL list and
    ``classify.SIGNALS``."""
    from webhook.cluster.classify import SIGNALS

    variables = one(render(helm, {}), "ValidatingAdmissionPolicy")["spec"]["variables"]
    (signals,) = [v["expression"] for v in variables if v["name"] == "signals"]
    assert set(json.loads(signals)) == set(SIGNALS)
