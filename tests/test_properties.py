"""Property-based tests over whole AdmissionReviews (hypothesis), through the Flask app.

Random Jobs and Pods with random annotation values (unicode, huge, negative, floats,
empty, whitespace), random user rules, affinities and env, and fields set to null or
removed at every level. Invariants, for every input:
- the answer is a well-formed AdmissionReview (or a 400 with a reason), never a 500;
- a patch always applies, and the result keeps every field the policy does not own;
- the webhook applied to its own output changes nothing, and validation accepts it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonpatch
import yaml
from conftest import P, job, job_owner, leaves, pod, review
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from webhook import explain
from webhook.admission import engine
from webhook.admission.review import decode
from webhook.cluster.attempts import AttemptLookup
from webhook.cluster.facts import NoCluster
from webhook.kinds import registry as defaults
from webhook.policy.config import parse_config
from webhook.serving.app import State, create_app

KEYS = [
    "fail-non-retriable",
    "retriable-exit-codes",
    "backoff-limit",
    "ignore-disruptions",
    "non-spot-attempts",
    "error-propagation",
    "oom-memory-factor",
    "oom-memory-limit",
    "avoid-failed-nodes",
    "attempt",
    "applied",
    "backof-limit",  # unknown keys: a typo, and the bare prefix
    "",
]
TRICKY = [
    "true",
    "false",
    "0",
    "1",
    "3",
    "6",
    "143",
    "143,137",
    "1,255",
    "earliest",
    "none",
    "-1",
    "1.5",
    "",
    " ",
    " 3",
    "3 ",
    "1e9",
    "99999999999999999999",
    "2147483648",
    "٣",
    "TRUE",
    "0x10",
    "143,,137",
    "256",
    "\x00",
    "\n3",
    "ℵ",
    "3" * 300,
]
VALID = {
    "fail-non-retriable": ["true", "false"],
    "retriable-exit-codes": ["143", "137,143", "1,2,3"],
    "backoff-limit": ["0", "1", "3", "6"],
    "ignore-disruptions": ["true", "false"],
    "non-spot-attempts": ["0", "1", "2"],
    "error-propagation": ["earliest", "none"],
    "attempt": ["0", "2", "5"],
    "oom-memory-factor": ["1.5", "2", "1.001"],
    "oom-memory-limit": ["8Gi", "3Gi", "1G", "20000M"],
    "avoid-failed-nodes": ["true", "false"],
}
tricky = st.sampled_from(TRICKY) | st.text(max_size=12)


WORKLOAD_KEYS = [k for k in KEYS[:9]]
POD_KEYS = [
    "backoff-limit",
    "non-spot-attempts",
    "error-propagation",
    "oom-memory-factor",
    "oom-memory-limit",
    "avoid-failed-nodes",
    "attempt",
]


@st.composite
def annotations(draw, scope: list[str] = KEYS) -> dict[str, str]:
    """Mostly valid policies for the object's kind (so the mutation paths run), sometimes
    any key (unknown, wrong scope) and hostile values."""
    pool = KEYS if draw(st.integers(0, 9)) == 0 else scope
    keys = draw(st.lists(st.sampled_from(pool), max_size=5, unique=True))
    result = {}
    for key in keys:
        valid = VALID.get(key)
        hostile = not valid or draw(st.integers(0, 19)) == 0
        result[P + key] = draw(tricky) if hostile else draw(st.sampled_from(valid))
    return result


CONFIGS = [
    parse_config(""),
    parse_config(
        "defaults: {fail-non-retriable: true, ignore-disruptions: true, backoff-limit: 2}\n"
        "guardRails: {maxBackoffLimit: 4}\n"
    ),
    parse_config("defaults: {non-spot-attempts: 1, error-propagation: earliest}\n"),
    parse_config(
        "defaults: {oom-memory-factor: 1.5, oom-memory-limit: 4Gi, avoid-failed-nodes: true}\n"
        "guardRails: {maxAvoidedNodes: 2}\n"
    ),
]

exit_rule = st.builds(
    lambda action, op, vals, name: {
        "action": action,
        "onExitCodes": {"operator": op, "values": sorted(set(vals)), **name},
    },
    st.sampled_from(["FailJob", "Ignore", "Count"]),
    st.sampled_from(["In", "NotIn"]),
    st.lists(st.integers(1, 255), min_size=1, max_size=4),
    st.sampled_from([{}, {"containerName": "main"}]),
)
condition_rule = st.builds(
    lambda action, kind: {"action": action, "onPodConditions": [{"type": kind, "status": "True"}]},
    st.sampled_from(["Ignore", "Count", "FailJob"]),
    st.sampled_from(["DisruptionTarget", "ConfigIssue"]),
)
requirement = st.builds(
    lambda key, op, vals: {"key": key, "operator": op, "values": vals},
    st.sampled_from(["gpu", "karpenter.sh/capacity-type", "cloud.google.com/gke-spot"]),
    st.sampled_from(["In", "NotIn"]),
    st.lists(st.sampled_from(["a100", "spot", "true", "on-demand"]), min_size=1, max_size=2),
)
affinity = st.none() | st.builds(
    lambda terms: {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    },
    st.lists(
        st.builds(lambda exprs: {"matchExpressions": exprs}, st.lists(requirement, max_size=2)),
        max_size=2,
    ),
)
env = st.lists(
    st.builds(
        lambda name, value: {"name": name, "value": value},
        st.sampled_from(["A", "FLYTE_INTERNAL_WORKER_NAME", "_F_DES", "B"]),
        st.text(max_size=5),
    ),
    max_size=3,
)


#: Server-side apply records (``webhook.kube.intent`` reads the ``Apply`` ones) and others.
managed_entry = st.builds(
    lambda operation, fields: {
        "manager": "kubectl" if operation == "Apply" else "job-controller",
        "operation": operation,
        "apiVersion": "batch/v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    },
    st.sampled_from(["Apply", "Apply", "Update"]),
    st.sampled_from(
        [
            {"f:spec": {"f:backoffLimit": {}}},
            {"f:spec": {"f:podReplacementPolicy": {}, "f:template": {"f:spec": {}}}},
            {"f:spec": {"f:template": {"f:spec": {"f:restartPolicy": {}}}}},
            {"f:metadata": {"f:name": {}}},
            {},
        ]
    ),
)


resources = st.sampled_from(
    [
        {},
        {"resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}},
        {"resources": {"requests": {"memory": "1500M"}}},
        {"resources": {"limits": {"memory": "3Gi", "cpu": "2"}}},
        {"resources": {"requests": {"memory": "6Gi"}, "limits": {"memory": "12Gi"}}},
    ]
).map(copy.deepcopy)  # (a fresh copy each time: the objects made are damaged later)


@st.composite
def objects(draw) -> dict[str, Any]:
    containers = [
        {"name": name, "image": "busybox:1.36", "env": draw(env), **draw(resources)}
        for name in draw(st.sampled_from([["main"], ["main", "side"]]))
    ]
    if draw(st.booleans()):
        obj = job(
            draw(annotations(WORKLOAD_KEYS)),
            restart_policy=draw(st.sampled_from(["Never"] * 4 + ["OnFailure"])),
            containers=containers,
            template_annotations=draw(annotations(POD_KEYS))
            if draw(st.integers(0, 4)) == 0
            else None,
            applied=draw(st.booleans()),
            spec={
                k: v
                for k, v in {
                    "backoffLimit": draw(st.none() | st.integers(0, 8)),
                    "podFailurePolicy": draw(
                        st.none()
                        | st.builds(
                            lambda r: {"rules": r}, st.lists(exit_rule | condition_rule, max_size=4)
                        )
                    ),
                }.items()
                if v is not None
            },
        )
        pod_spec = obj["spec"]["template"]["spec"]
        managed = draw(st.lists(managed_entry, max_size=2))
        if managed:
            obj["metadata"]["managedFields"] = managed
    else:
        obj = pod(
            draw(annotations(POD_KEYS)),
            owner=job_owner() if draw(st.booleans()) else None,
            spec={"containers": containers},
        )
        pod_spec = obj["spec"]
        # Attempt sources besides our annotation (JobSet runs, per-index failure counts).
        for field, key in (
            ("labels", "jobset.sigs.k8s.io/restart-attempt"),
            ("annotations", "jobset.sigs.k8s.io/restart-attempt"),
            ("annotations", "batch.kubernetes.io/job-index-failure-count"),
        ):
            value = draw(st.none() | st.sampled_from(["0", "2", "3", "x"]))
            if value is not None:
                obj["metadata"].setdefault(field, {})[key] = value
    aff = draw(affinity)
    if aff is not None:
        pod_spec["affinity"] = aff
    if draw(st.booleans()):
        pod_spec["nodeSelector"] = draw(
            st.dictionaries(
                st.sampled_from(["karpenter.sh/capacity-type", "disk"]),
                st.sampled_from(["spot", "ssd"]),
                max_size=1,
            )
        )
    # Damage: null or remove fields at random depths.
    for _ in range(draw(st.sampled_from([0, 0, 1, 2, 3]))):
        node, key = _pick(draw, obj)
        if key is None:
            continue
        if draw(st.booleans()):
            node[key] = None
        elif isinstance(node, dict):
            del node[key]
    return obj


def _pick(draw, obj):
    node: Any = obj
    parent, key = None, None
    for _ in range(draw(st.integers(1, 6))):
        if isinstance(node, dict) and node:
            k = draw(st.sampled_from(sorted(node)))
        elif isinstance(node, list) and node:
            k = draw(st.integers(0, len(node) - 1))
        else:
            break
        parent, key, node = node, k, node[k]
    if key in ("apiVersion", "kind") and parent is obj:
        return None, None
    return parent, key


OWNED = {("spec", "backoffLimit"), ("spec", "podReplacementPolicy")}


def lookup(doc, path):
    for part in path:
        doc = doc[part]
    return doc


def post(client, path, body):
    response = client.post(path, data=json.dumps(body), content_type="application/json")
    assert response.status_code in (200, 400), response.data
    data = response.get_json()
    if response.status_code == 400:
        assert data["reason"]
        return None
    assert data["apiVersion"] == "admission.k8s.io/v1" and data["kind"] == "AdmissionReview"
    assert data["response"]["uid"] == body["request"]["uid"]
    return data["response"]


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objects(), st.sampled_from(range(len(CONFIGS))))
def test_any_object_gets_a_sound_answer(obj, config_index):
    client = create_app(State(config=CONFIGS[config_index])).test_client()
    original = copy.deepcopy(obj)
    body = review(obj)
    answer = post(client, "/mutate", body)
    assert obj == original  # the request object is never modified in place
    if answer is None:
        event("400")
        return
    event("denied" if not answer["allowed"] else ("patched" if "patch" in answer else "unchanged"))
    if not answer["allowed"]:
        assert answer["status"]["code"] >= 400 and answer["status"]["message"]
        assert "patch" not in answer
        return
    patch = []
    if "patch" in answer:
        assert answer["patchType"] == "JSONPatch"
        import base64

        patch = json.loads(base64.b64decode(answer["patch"]))
    mutated = jsonpatch.apply_patch(copy.deepcopy(obj), patch)
    for path, value in leaves(obj):
        if path[:2] in OWNED or path == ("metadata", "annotations", P + "applied"):
            continue
        assert lookup(mutated, path) == value, path
    again = post(client, "/mutate", review(mutated))
    assert again["allowed"] and "patch" not in again, again
    checked = post(client, "/validate", review(mutated))
    if obj.get("kind") == "Job":
        assert checked["allowed"], checked


@st.composite
def mistyped_objects(draw) -> dict[str, Any]:
    """Jobs and Pods with a field of the wrong JSON type somewhere (a number where the
    containers are, a string for an affinity). The API server refuses these before any
    webhook sees them, but ``dry-run`` and ``explain`` read files people write."""
    obj = draw(objects() | st.sampled_from(EXAMPLES).map(copy.deepcopy))
    for _ in range(draw(st.integers(1, 3))):
        node, key = _pick(draw, obj)
        if key is not None:
            node[key] = draw(st.sampled_from([3, "x", True, [3], ["x"], [[]], {"a": 1}]))
    return obj


#: Every kind we mutate, as the shipped examples write them, defaulted as admitted.
EXAMPLES = [
    doc
    for path in sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.yaml"))
    for doc in yaml.safe_load_all(path.read_text())
    if isinstance(doc, dict)
]
for _doc in EXAMPLES:
    defaults.apply_defaults(_doc)


class TwoFailures(NoCluster):
    """Every Job has failed twice (so the pods' placement runs)."""

    def job_failures(self, namespace: str, name: str, uid: str) -> AttemptLookup:
        return AttemptLookup(2, "test")

    def stats(self) -> dict[str, Any]:
        return {}


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mistyped_objects(), st.sampled_from(range(len(CONFIGS))))
def test_a_mistyped_object_never_meets_an_internal_error(obj, config_index):
    config = CONFIGS[config_index]
    body = review({"kind": obj["kind"], "apiVersion": obj["apiVersion"]})
    body["request"]["object"] = obj
    for decide in (
        lambda request: engine.mutate(request, config, TwoFailures()),
        lambda request: engine.validate(request, config),
    ):
        verdict = decide(decode(json.dumps(body).encode()))
        said = [*verdict.warnings, verdict.message]
        assert not any("internal error" in text for text in said), said
    # The dry run's and explain's own steps: the API server's defaults, then the plan.
    defaults.apply_defaults(obj)
    try:
        explain.explain(obj, config, "ml")
    except explain.ExplainError as err:  # a refusal with a reason is an answer
        assert str(err)


def test_a_pod_whose_namespace_is_not_a_string_gets_an_answer():
    """Found by the test above: a list for ``metadata.namespace`` made the attempt lookup's
    question unhashable (the API server refuses such a pod; we must still answer)."""
    made = pod(
        {P + "backoff-limit": "2", P + "non-spot-attempts": "1", P + "oom-memory-factor": "2"},
        owner=job_owner(),
    )
    made["metadata"]["namespace"] = ["ml"]
    body = review(made)
    body["request"]["namespace"] = None
    verdict = engine.mutate(decode(json.dumps(body).encode()), parse_config("{}"), TwoFailures())
    assert not any("internal error" in text for text in [*verdict.warnings, verdict.message])
