"""The verdict memo: a repeat of an object template is answered from memory, and never
with an answer the policy would not give the new object."""

from __future__ import annotations

import copy
import json
import uuid

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from testkit.builders import FULL, P, apply, job, job_owner, pod, review, stored
from testkit.strategies import CONFIGS, objects, pick
from testkit.workloads import FixedAttempts, mutate
from webhook.admission import engine, memo
from webhook.admission import review as admission
from webhook.kube import jobcontroller
from webhook.kube.wellknown import COMPLETION_INDEX
from webhook.policy.config import Config, parse_config


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
    """The answer computed afresh on the whole object (no memo, no view)."""
    request = request_for(obj)
    found = engine._mutator_for(request, config, attempts)
    return engine._apply(*found, request)[0] if found is not None else admission.Verdict()


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


def test_pods_of_an_indexed_job_share_one_run_and_keep_their_own_index():
    """Each index's pod differs in its index label and annotation, hostname and
    generateName: none of them is in the view, so one run answers all, and the patch
    leaves each pod's own alone."""
    # upstream: manageJob (pkg/controller/job/job_controller.go): hostname and generateName
    # per index; addCompletionIndexLabel (pkg/controller/job/indexed_job_utils.go).
    spec = {"completionMode": "Indexed", "completions": 4, "backoffLimitPerIndex": 2}
    made = stored(mutate(job({P + "non-spot-attempts": "1"}, spec=spec))[1], uid="u-1")
    engine.MEMO.clear()  # (the Job's own run)
    config, attempts = Config(), FixedAttempts(None)
    outs = {}
    for index in (5, 6):
        made_pod = jobcontroller.pod_from_template(made, index, index_failures=2)
        verdict = engine.mutate(request_for(made_pod), config, attempts)
        assert verdict == uncached(made_pod, config, attempts)
        outs[index] = apply(made_pod, verdict.patch)
    assert engine.MEMO.stats() == {"entries": 1, "hits": 1, "misses": 1}
    for index, out in outs.items():
        assert out["spec"]["hostname"] == f"train-{index}"
        assert out["metadata"]["generateName"] == f"train-{index}-"
        assert out["metadata"]["labels"][COMPLETION_INDEX] == str(index)
        assert "affinity" in out["spec"]  # the index's last attempt
    assert outs[5]["spec"]["containers"] == outs[6]["spec"]["containers"]


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
    from webhook.kinds import registry

    real = registry.lookup("batch", "v1", "Job")
    obj, config = job(FULL), Config()

    class Broken:
        """The Job mutator, failing inside ``mutate`` (a bug)."""

        group, kind, enforce_applied = real.group, real.kind, real.enforce_applied
        owns, remember, reevaluate_on_update = real.owns, real.remember, ()

        def applies(self, obj, ctx):
            return real.applies(obj, ctx)

        def mutate(self, obj, ctx):
            raise RuntimeError("boom")

    monkeypatch.setitem(registry.MUTATORS, ("batch", "v1", "Job"), Broken())
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


def test_large_views_and_a_zero_size_memo_remember_nothing():
    big = job(FULL)
    big["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": f"VARIABLE_{i:06d}_" + "x" * 80, "value": "v"}
        for i in range(memo.MAX_KEY_BYTES // 80)
    ]
    assert engine.mutate(request_for(big), Config()).patch
    assert len(engine.MEMO) == 0
    engine.MEMO.max_entries = 0
    engine.mutate(request_for(job(FULL)), Config())
    assert len(engine.MEMO) == 0


def test_a_large_object_with_a_small_view_is_remembered():
    """Env var values are not in the view: a 1 MiB pod of config values is one key."""
    config, attempts = Config(), FixedAttempts(3)
    first, second = pods_of_one_job(2)
    for obj, filler in ((first, "x"), (second, "y")):
        obj["spec"]["containers"][0]["env"] = [
            {"name": f"CONFIG_{i}", "value": filler * 1000} for i in range(1000)
        ]
    engine.mutate(request_for(first), config, attempts)
    answer = engine.mutate(request_for(second), config, attempts)
    assert engine.MEMO.hits == 1
    assert answer == uncached(second, config, attempts)
    assert any(op["path"] == "/spec/affinity" for op in answer.patch)


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
        node, key = pick(draw, other)
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


def test_jobs_applied_from_one_manifest_under_new_names_share_one_run():
    """kubectl apply of one manifest with a new name, image and arguments each time: the
    records differ, but not in what they say was written under spec."""
    config = Config()
    containers = [{"name": "main", "image": "trainer:1", "args": ["--lr", "0.1"]}]
    first = job(FULL, name="run-1", applied=True, containers=containers)
    containers = [{"name": "main", "image": "trainer:2", "args": ["--lr", "0.2", "--x"]}]
    second = job(FULL, name="run-2", applied=True, containers=containers)
    engine.mutate(request_for(first), config)
    answer = engine.mutate(request_for(second), config)
    assert engine.MEMO.stats() == {"entries": 1, "hits": 1, "misses": 1}
    assert answer == uncached(second, config)
    # A manifest that writes backoffLimit says something else: its own run (a denial).
    written = job(FULL, name="run-3", applied=True, spec={"backoffLimit": 5})
    denied = engine.mutate(request_for(written), config)
    assert engine.MEMO.hits == 1
    assert not denied.allowed and "contradicts spec.backoffLimit" in denied.message
    assert denied == uncached(written, config)


#: Per-object values outside the view (``webhook.kinds.view``): names, uids, labels, images,
#: arguments, env var values, resources, volumes, others' annotations and records.
OUTSIDE = st.sampled_from(
    [
        ("metadata", "name"),
        ("metadata", "uid"),
        ("metadata", "labels"),
        ("metadata", "annotations", "example.com/run"),
        ("metadata", "managedFields"),
        ("metadata", "annotations", "kubectl.kubernetes.io/last-applied-configuration"),
        ("container", "image"),
        ("container", "args"),
        ("container", "resources"),
        ("container", "env-values"),
        ("pod", "volumes"),
        ("pod", "serviceAccountName"),
        ("template", "labels"),
    ]
)


def _vary_outside(obj, where, n: int):
    """``obj`` with one field outside its view changed (or added), as another object of
    its template would have it."""
    if where == ("metadata", "labels") and isinstance(obj.get("metadata"), dict):
        obj["metadata"].setdefault("labels", {"app": "train"})  # (both have the mapping)
    other = copy.deepcopy(obj)
    meta = other.get("metadata")
    spec = other.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return other
    template, pod_spec = None, spec
    if other["kind"] == "Job":
        template = spec.get("template")
        pod_spec = template.get("spec") if isinstance(template, dict) else None
    if where[0] == "metadata":
        if where[1] == "annotations":
            annotations = meta.get("annotations")
            if where[2] == memo.LAST_APPLIED and isinstance(annotations, dict):
                record = annotations.get(where[2])
                if isinstance(record, str) and record.startswith("{"):
                    data = json.loads(record)
                    if isinstance(data, dict):
                        data.setdefault("metadata", {})["name"] = f"other-{n}"
                        annotations[where[2]] = json.dumps(data)
            elif isinstance(annotations, dict):  # (adding the mapping is a change in view)
                annotations[where[2]] = f"run-{n}"
        elif where[1] == "labels" and other["kind"] == "Job":
            # Another value of a label not ours: the labels mapping itself is in a Job's
            # view (the managed label is written into it: ``kinds.audit``), so it must be
            # there or not in both objects alike.
            labels = meta.get("labels")
            if isinstance(labels, dict):
                labels["pipeline.example/run"] = f"run-{n}"
        elif where[1] == "managedFields" and other["kind"] == "Job":
            managed = meta.get("managedFields")
            entry = {"manager": "x", "operation": "Update", "fieldsV1": {"f:spec": {}}}
            meta["managedFields"] = [*(managed if isinstance(managed, list) else []), entry]
        elif where[1] in ("name", "uid"):
            meta[where[1]] = f"other-{n}"
    elif where[0] == "template" and isinstance(template, dict):
        tmeta = template.get("metadata")
        labels = tmeta.get("labels") if isinstance(tmeta, dict) else None
        # Another value of a label not ours: the labels mapping itself is in the view (the
        # Job mutator writes our labels into it: ``plan.causes``), so it must be there
        # or not in both objects alike.
        if isinstance(labels, dict):
            labels["run"] = f"r{n}"
    elif isinstance(pod_spec, dict):
        if where[0] == "pod":
            pod_spec[where[1]] = [{"name": f"v{n}", "emptyDir": {}}] if n % 2 else f"sa-{n}"
        else:
            containers = pod_spec.get("containers")
            for c in containers if isinstance(containers, list) else []:
                if not isinstance(c, dict):
                    continue
                if where[1] == "env-values":
                    for e in c.get("env") if isinstance(c.get("env"), list) else []:
                        if isinstance(e, dict) and "name" in e:
                            e["value"] = f"value-{n}"
                elif where[1] == "resources":
                    # Memory is read when a policy raises it, and the requests and limits
                    # mappings are kept (written into): only a CPU value changes here.
                    kept = c.get("resources") if isinstance(c.get("resources"), dict) else {}
                    varied = {**kept, "claims": [{"name": f"claim-{n}"}]}
                    for kind in ("limits", "requests"):
                        if isinstance(kept.get(kind), dict):
                            varied = {**kept, kind: {**kept[kind], "cpu": str(n)}}
                    c["resources"] = varied
                else:
                    c[where[1]] = {"image": f"img:{n}", "args": ["--n", str(n)]}.get(
                        where[1], {"limits": {"cpu": str(n)}}
                    )
    return other


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objects(), OUTSIDE, st.sampled_from(range(len(CONFIGS))), st.sampled_from([None, 3]))
def test_an_object_changed_outside_its_view_shares_the_answer(obj, where, config_index, failures):
    """What the view drops is never read: another object that differs only there gets the
    remembered answer, and it is the answer computed afresh on that whole object."""
    engine.MEMO.clear()
    config, attempts = CONFIGS[config_index], FixedAttempts(failures)
    other = _vary_outside(obj, where, 7)
    first = engine.mutate(request_for(obj), config, attempts)
    hits = engine.MEMO.hits
    assert engine.mutate(request_for(other), config, attempts) == uncached(other, config, attempts)
    if len(engine.MEMO):  # a first answer was remembered: the other object shares it
        assert engine.MEMO.hits == hits + 1
        event("answered from memory")
    assert first == uncached(obj, config, attempts)
    engine.validate(request_for(obj), config)
    assert engine.validate(request_for(other), config) == _validate_uncached(other, config)
    event(f"changed {'.'.join(where)}")
