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
from typing import Any

import jsonpatch
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from testkit.builders import P, job_owner, leaves, pod, review
from testkit.strategies import CONFIGS, objects, pick
from testkit.tools import ROOT
from webhook import explain
from webhook.admission import engine
from webhook.admission.review import decode
from webhook.cluster.attempts import AttemptLookup
from webhook.cluster.facts import NoCluster
from webhook.kinds import registry as defaults
from webhook.policy.config import parse_config
from webhook.serving.app import State, create_app

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
        node, key = pick(draw, obj)
        if key is not None:
            node[key] = draw(st.sampled_from([3, "x", True, [3], ["x"], [[]], {"a": 1}]))
    return obj


#: Every kind we mutate, as the shipped examples write them, defaulted as admitted.
EXAMPLES = [
    doc
    for path in sorted((ROOT / "examples").glob("*.yaml"))
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
