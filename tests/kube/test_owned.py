"""The copy a mutator edits shares what it never writes (``webhook.kube.owned``): the copy
must be new wherever the mutator writes, or the request's object would be changed and the
change lost from the patch. Checked on the unit, and as a contract on every Job and Pod
mutator: with the shared copy and with a full copy, the same patch and the same outcome,
and the original untouched."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testkit.builders import P, job, job_owner, pod
from testkit.strategies import CONFIGS, objects
from testkit.tools import ROOT
from webhook.admission import engine
from webhook.admission.jsondiff import diff
from webhook.cluster.attempts import AttemptLookup
from webhook.cluster.facts import NoCluster
from webhook.kinds import registry as defaults
from webhook.kinds.registry import lookup
from webhook.kube.owned import ALL, SHALLOW, Each, copy_owned, deep_copy
from webhook.plan.outcome import Context


def test_copy_is_new_along_owned_paths_and_shared_elsewhere():
    original = {
        "metadata": {"name": "a", "annotations": {"x": "1"}, "managedFields": [{"m": 1}]},
        "spec": {
            "containers": [{"name": "c", "env": [{"name": "E"}], "resources": {"limits": {}}}],
            "affinity": {"nodeAffinity": {"terms": [{"k": "v"}]}},
            "volumes": [{"name": "v"}],
        },
    }
    owned = {
        "metadata": {"annotations": SHALLOW},
        "spec": {"containers": Each({"env": SHALLOW}), "affinity": ALL},
    }
    copied = copy_owned(original, owned)
    assert copied == original
    # New along the paths...
    assert copied is not original and copied["spec"] is not original["spec"]
    assert copied["metadata"]["annotations"] is not original["metadata"]["annotations"]
    container, old_container = copied["spec"]["containers"][0], original["spec"]["containers"][0]
    assert container is not old_container and container["env"] is not old_container["env"]
    affinity = copied["spec"]["affinity"]["nodeAffinity"]
    assert affinity["terms"][0] is not original["spec"]["affinity"]["nodeAffinity"]["terms"][0]
    # ...shared elsewhere (a SHALLOW list's items too).
    assert copied["metadata"]["managedFields"] is original["metadata"]["managedFields"]
    assert copied["spec"]["volumes"] is original["spec"]["volumes"]
    assert container["resources"] is old_container["resources"]
    assert container["env"][0] is old_container["env"][0]
    # Writing where it is owned leaves the original as it was.
    before = copy.deepcopy(original)
    copied["metadata"]["annotations"]["y"] = "2"
    container["env"].append({"name": "F"})
    copied["spec"]["affinity"]["nodeAffinity"]["terms"][0]["k"] = "w"
    copied["spec"]["new"] = 1
    assert original == before


@pytest.mark.parametrize(
    "value, owned",
    [
        ({"spec": [{"a": {"b": 1}}]}, {"spec": {"a": ALL}}),  # a list where a mapping is owned
        ({"spec": {"a": {"b": 1}}}, {"spec": Each(ALL)}),  # a mapping where a list is
        ({"spec": None}, {"spec": {"a": ALL}}),
    ],
)
def test_an_unexpected_shape_is_copied_deeply(value, owned):
    copied = copy_owned(value, owned)
    assert copied == value
    if value["spec"] is not None:
        assert copied["spec"] is not value["spec"]
        first = value["spec"][0] if isinstance(value["spec"], list) else value["spec"]["a"]
        again = copied["spec"][0] if isinstance(copied["spec"], list) else copied["spec"]["a"]
        assert again is not first


def test_deep_copy_shares_only_scalars():
    value = {"a": [{"b": [1, "x", None, 2.5, True]}], "c": {}}
    copied = deep_copy(value)
    assert copied == value
    assert copied["a"] is not value["a"] and copied["a"][0]["b"] is not value["a"][0]["b"]
    assert copied["c"] is not value["c"]


class FixedAttempts(NoCluster):
    """Every Job has failed ``failures`` times (so the last-attempt placement runs)."""

    def __init__(self, failures: int):
        self.failures = failures

    def job_failures(self, namespace: str, name: str, uid: str) -> AttemptLookup:
        return AttemptLookup(self.failures, "test")

    def stats(self) -> dict[str, Any]:
        return {}


def _both_ways(obj: dict[str, Any], config, attempts) -> None:
    """The contract: the shared copy gives exactly what a full copy gives, and the
    original is untouched."""
    kind = obj.get("kind")
    mutator = lookup("batch" if kind == "Job" else "", "v1", kind)
    assert mutator is not None and mutator.owns is not ALL
    before = orjson.dumps(obj)
    outcomes = []
    copies = (
        engine.json_copy(obj),
        engine.editable(mutator, obj),
        engine.editable(mutator, obj, config),  # (what the mutator owns of this object)
    )
    for editable in copies:
        ctx = Context(config, attempts, "ml", "CREATE")
        try:
            outcome = mutator.mutate(editable, ctx)
        except Exception as err:  # the engine's internal-error path: both ways alike
            outcomes.append(("raised", type(err).__name__))
            continue
        assert orjson.dumps(obj) == before, "the mutator wrote into a shared part"
        outcomes.append((diff(obj, editable), outcome.warnings, [str(p) for p in outcome.problems]))
    assert outcomes[0] == outcomes[1] == outcomes[2]


def _examples() -> list[dict[str, Any]]:
    found = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in ("Job", "Pod"):
                doc.setdefault("metadata", {}).setdefault("namespace", "ml")
                defaults.apply_defaults(doc)
                found.append(doc)
    return found


ALL_KEYS = {
    P + "fail-non-retriable": "true",
    P + "retriable-exit-codes": "137,143",
    P + "backoff-limit": "3",
    P + "ignore-disruptions": "true",
    P + "non-spot-attempts": "2",
    P + "error-propagation": "earliest",
}


def _known() -> list[dict[str, Any]]:
    pod_keys = {P + k: ALL_KEYS[P + k] for k in ("backoff-limit", "non-spot-attempts")}
    pod_keys[P + "error-propagation"] = "earliest"
    init = {"name": "init", "image": "busybox", "env": [{"name": "A", "value": "1"}]}
    spot_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
                ]
            }
        }
    }
    made = [
        job(ALL_KEYS),
        job(ALL_KEYS, applied=True),
        job(
            ALL_KEYS,
            spec={
                "podFailurePolicy": {
                    "rules": [
                        {
                            "action": "Count",
                            "onPodConditions": [{"type": "ConfigIssue", "status": "True"}],
                        }
                    ]
                },
                "podReplacementPolicy": "TerminatingOrFailed",
            },
        ),
        job({P + "backoff-limit": "2"}, spec={"backoffLimitPerIndex": 1}),
        job({**ALL_KEYS, P + "on-non-retriable": "fail-index"}, spec={"completionMode": "Indexed"}),
        pod(pod_keys, owner=job_owner()),
        pod({**pod_keys, P + "attempt": "3"}, spec={"containers": [init], "affinity": {}}),
    ]
    with_affinity = pod(pod_keys, owner=job_owner())
    with_affinity["spec"]["affinity"] = spot_affinity
    with_affinity["spec"]["initContainers"] = [dict(init)]
    made.append(with_affinity)
    return [*made, *_examples()]


@pytest.mark.parametrize("failures", [0, 3])
@pytest.mark.parametrize("config_index", range(len(CONFIGS)))
def test_known_jobs_and_pods_give_the_same_answer_from_the_shared_copy(failures, config_index):
    objects_ = _known()
    assert {o["kind"] for o in objects_} == {"Job", "Pod"}
    for obj in objects_:
        _both_ways(obj, CONFIGS[config_index], FixedAttempts(failures))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objects(), st.sampled_from(range(len(CONFIGS))), st.integers(0, 4))
def test_any_job_or_pod_gives_the_same_answer_from_the_shared_copy(obj, config_index, failures):
    _both_ways(obj, CONFIGS[config_index], FixedAttempts(failures))
