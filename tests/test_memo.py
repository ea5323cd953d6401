"""The verdict memo: a repeat of an object template is answered from memory, and never
with an answer the policy would not give the new object."""

from __future__ import annotations

import copy
import json
import uuid

import pytest
from conftest import FULL, P, job, job_owner, pod, review
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_properties import CONFIGS, _pick, objects
from workloads import FixedAttempts

from webhook import admission, engine, memo
from webhook.config import Config, parse_config


@pytest.fixture(autouse=True)
def empty_memo():
    engine.MEMO.clear()
    engine.MEMO.max_entries = memo.MAX_ENTRIES
    yield
    engine.MEMO.clear()
    engine.MEMO.max_entries = memo.MAX_ENTRIES


def request_for(obj):
    body = review({**obj, "metadata": {}})  # the envelope; the object goes in whole below
    body["request"]["object"] = obj
    return admission.decode(json.dumps(body).encode())


def uncached(obj, config, attempts=engine._NO_CLUSTER):
    return engine._mutate(request_for(obj), config, attempts)[0]


def sibling(obj, index: int = 7):
    """Another object of the same template: new identity, index and hostname (the
    index only where the object has labels and annotations: pods of one Indexed Job
    all carry it, so their shapes agree)."""
    other = copy.deepcopy(obj)
    meta = other.setdefault("metadata", {}) if isinstance(other.get("metadata"), dict) else None
    if meta is None:
        return other
    meta["name"] = f"sibling-{index}"
    meta["generateName"] = "sibling-"
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = "2026-11-22T00:00:07Z"
    for field in ("labels", "annotations"):
        values = meta.get(field)
        if isinstance(values, dict):
            values["batch.kubernetes.io/job-completion-index"] = str(index)
    if other.get("kind") == "Pod" and isinstance(other.get("spec"), dict):
        other["spec"]["hostname"] = f"sibling-{index}"
    return other


def pods_of_one_job(count: int):
    spec = {"containers": [{"name": "main", "image": "busybox:1.36"}]}
    policy = {
        P + "backoff-limit": "3",
        P + "non-spot-attempts": "1",
        P + "error-propagation": "earliest",
    }
    return [pod(policy, name=f"train-{i}-x", owner=job_owner(), spec=spec) for i in range(count)]


def test_pods_of_one_job_are_computed_once():
    config = Config()
    attempts = FixedAttempts(3)  # the last attempt: placement off spot
    first, second = pods_of_one_job(2)
    a = engine.mutate(request_for(first), config, attempts)
    b = engine.mutate(request_for(second), config, attempts)
    assert engine.MEMO.stats() == {"entries": 1, "hits": 1, "misses": 1}
    assert a.patch and any(op["path"].startswith("/spec/affinity") for op in a.patch)
    assert b == uncached(second, config, attempts)
    # The attempt was looked up again for the second pod (the answer may have changed).
    assert len(attempts.calls) == 3  # first pod, replay for the second, fresh run


def test_a_changed_attempt_count_is_computed_afresh():
    config = Config()
    attempts = FixedAttempts(1)  # attempt 2 of 4: spot is fine
    first, second = pods_of_one_job(2)
    early = engine.mutate(request_for(first), config, attempts)
    assert not any(op["path"].startswith("/spec/affinity") for op in early.patch)
    attempts.failures = 3  # two more failures: the next pod is the last attempt
    late = engine.mutate(request_for(second), config, attempts)
    assert any(op["path"].startswith("/spec/affinity") for op in late.patch)
    assert late == uncached(second, config, attempts)
    assert engine.MEMO.hits == 0


def test_a_new_config_is_never_answered_from_the_old_one():
    obj = job({P + "fail-non-retriable": "true"})
    old = Config()
    new = parse_config("defaults: {backoff-limit: 2}\n")
    engine.mutate(request_for(obj), old)
    answer = engine.mutate(request_for(sibling(obj)), new)
    assert answer == uncached(sibling(obj), new)
    assert any(op["path"] == "/spec/backoffLimit" and op["value"] == 2 for op in answer.patch)
    assert engine.MEMO.hits == 0


def test_callers_cannot_change_a_remembered_verdict():
    obj, config = job(FULL), Config()
    first = engine.mutate(request_for(obj), config)
    first.warnings.append("changed by a caller")
    first.warnings = []
    again = engine.mutate(request_for(sibling(obj)), config)
    assert engine.MEMO.hits == 1
    assert again.warnings and "changed by a caller" not in again.warnings


def test_an_internal_error_is_not_remembered(monkeypatch):
    from webhook import mutators

    real = mutators.lookup("batch", "Job")
    obj, config = job(FULL), Config()

    class Broken:
        """The Job mutator, failing inside ``mutate`` (a bug)."""

        group, kind, enforce_applied = real.group, real.kind, real.enforce_applied

        def applies(self, obj, ctx):
            return real.applies(obj, ctx)

        def mutate(self, obj, ctx):
            raise RuntimeError("boom")

    monkeypatch.setitem(mutators._REGISTRY, ("batch", "Job"), Broken())
    failed = engine.mutate(request_for(obj), config)
    assert failed.patch == [] and "internal error" in failed.warnings[0]
    denied = engine.validate(request_for(obj), config)
    assert not denied.allowed and "internal error" in denied.message
    monkeypatch.undo()
    assert len(engine.MEMO) == 0
    assert engine.mutate(request_for(obj), config).patch
    checked = engine.validate(request_for(obj), config)  # not mutated yet: "not applied"
    assert not checked.allowed and "internal error" not in checked.message


def test_denials_are_remembered_per_endpoint():
    bad = job({P + "backoff-limit": "lots"})
    config = Config()
    for obj in (bad, sibling(bad)):
        assert not engine.mutate(request_for(obj), config).allowed
        assert not engine.validate(request_for(obj), config).allowed
    assert engine.MEMO.stats() == {"entries": 2, "hits": 2, "misses": 2}


def test_large_objects_and_a_zero_size_memo_remember_nothing():
    big = job(FULL)
    big["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": f"V{i}", "value": "x" * 100} for i in range(memo.MAX_KEY_BYTES // 100)
    ]
    assert engine.mutate(request_for(big), Config()).patch
    assert len(engine.MEMO) == 0
    engine.MEMO.max_entries = 0
    engine.mutate(request_for(job(FULL)), Config())
    assert len(engine.MEMO) == 0


def test_the_oldest_entries_go_first():
    engine.MEMO.max_entries = 3
    config = Config()
    jobs = [job({P + "backoff-limit": str(n)}) for n in range(5)]
    for obj in jobs:
        engine.mutate(request_for(obj), config)
    assert len(engine.MEMO) == 3
    engine.mutate(request_for(sibling(jobs[4])), config)
    assert engine.MEMO.hits == 1
    engine.mutate(request_for(sibling(jobs[0])), config)
    assert engine.MEMO.hits == 1  # evicted


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objects(), st.sampled_from(range(len(CONFIGS))), st.sampled_from([None, 0, 2, 3]))
def test_a_sibling_gets_the_answer_the_policy_would_give_it(obj, config_index, failures):
    """The fields the memo ignores are never read: varying them never changes a verdict."""
    engine.MEMO.clear()
    config = CONFIGS[config_index]
    attempts = FixedAttempts(failures)
    other = sibling(obj)
    engine.mutate(request_for(obj), config, attempts)
    engine.validate(request_for(obj), config)
    hits = engine.MEMO.hits
    assert engine.mutate(request_for(other), config, attempts) == uncached(other, config, attempts)
    assert engine.validate(request_for(other), config) == _validate_uncached(other, config)
    event(f"answered from memory: {engine.MEMO.hits - hits} of 2")


def _validate_uncached(obj, config):
    remembering = engine.MEMO
    engine.MEMO = memo.Memo(0)
    try:
        return engine.validate(request_for(obj), config)
    finally:
        engine.MEMO = remembering


@st.composite
def variants(draw) -> tuple[dict, dict]:
    """An object and a near copy: one value somewhere replaced, or one key removed."""
    obj = draw(objects())
    other = copy.deepcopy(obj)
    for _ in range(draw(st.integers(1, 2))):
        node, key = _pick(draw, other)
        if key is None:
            continue
        if isinstance(node, dict) and draw(st.booleans()):
            del node[key]
        else:
            node[key] = draw(st.sampled_from([None, 0, 1, 4, "4", "true", "0,1", True, [], {}]))
    return obj, other


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variants(), st.sampled_from(range(len(CONFIGS))))
def test_a_different_object_never_gets_a_remembered_answer(pair, config_index):
    """Everything outside the ignored fields is part of the key: an object that differs
    from a remembered one anywhere else gets the answer computed for it."""
    first, second = pair
    engine.MEMO.clear()
    config = CONFIGS[config_index]
    attempts = FixedAttempts(3)
    engine.mutate(request_for(first), config, attempts)
    engine.validate(request_for(first), config)
    assert engine.mutate(request_for(second), config, attempts) == uncached(
        second, config, attempts
    )
    assert engine.validate(request_for(second), config) == _validate_uncached(second, config)


def test_objects_written_with_kubectl_apply_are_not_remembered():
    """Their last-applied record names them: no other object can repeat one."""
    applied = job(FULL, applied=True)
    assert engine.mutate(request_for(applied), Config()).patch
    assert len(engine.MEMO) == 0
    assert memo.fingerprint(applied, "Job") is None
    assert memo.fingerprint(job(FULL), "Job") is not None
