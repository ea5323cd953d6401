"""``retry-webhook explain``: provenance, rules in words, the attempt plan, --simulate,
80-column text, JSON that agrees with the text, CLI exit codes, the pointer warning."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testkit.builders import P, job, job_owner, pod, review
from testkit.cli import run
from testkit.explain import (
    assert_text_and_json_agree,
    doc_block,
    explained,
    manifest,
    one,
    rows,
    setting,
)
from testkit.servers import scaled
from testkit.tools import ROOT
from webhook import cli, explain
from webhook.admission import engine
from webhook.admission import review as admission
from webhook.plan.explained import AttemptGap
from webhook.policy.config import Config, parse_config

BIN = Path(sys.executable).parent / "retry-webhook"
EXAMPLE = ROOT / "examples" / "job.yaml"


def example():
    return yaml.safe_load(EXAMPLE.read_text())


FULL = {
    P + "fail-non-retriable": "true",
    P + "backoff-limit": "3",
    P + "ignore-disruptions": "true",
    P + "non-spot-attempts": "1",
}

# --- provenance: where each setting came from ---------------------------------------------


def test_provenance_annotation():
    item = one(manifest(FULL))
    backoff = setting(item, "backoff-limit")
    assert (backoff.value, backoff.source, backoff.text) == ("3", "annotation", "your annotation")
    assert "from your annotation retry-policy.dev/backoff-limit" in item.budget


def test_provenance_your_spec_beats_a_cluster_default():
    config = parse_config("defaults: {backoff-limit: 5, ignore-disruptions: true}")
    item = one(manifest(spec={"backoffLimit": 2}), config)
    backoff = setting(item, "backoff-limit")
    assert (backoff.value, backoff.source) == ("2", "your spec")
    assert backoff.text == "your own spec.backoffLimit"
    assert setting(item, "ignore-disruptions").source == "cluster default"
    assert item.attempts.limit == 2


def test_provenance_namespace_and_cluster_defaults():
    config = parse_config(
        "defaults: {backoff-limit: 3, non-spot-attempts: 1}\n"
        "namespaces: {research: {defaults: {backoff-limit: 8}}}"
    )
    research = one(manifest(namespace="research"), config)
    assert setting(research, "backoff-limit").value == "8"
    assert setting(research, "backoff-limit").text == "namespace default for research"
    assert setting(research, "non-spot-attempts").text == "cluster default"
    other = one(manifest(namespace="ml"), config)
    assert (setting(other, "backoff-limit").value, setting(other, "backoff-limit").text) == (
        "3",
        "cluster default",
    )


def test_provenance_kubernetes_default_with_and_without_a_managed_policy():
    # No annotation and no config: the mutator never runs; the default is still explained.
    plain = one(manifest())
    assert (setting(plain, "backoff-limit").value, setting(plain, "backoff-limit").source) == (
        "6",
        "Kubernetes default",
    )
    assert setting(plain, "fail-non-retriable").text == "not set"
    assert plain.changes == []
    managed = one(manifest({P + "ignore-disruptions": "true"}))
    assert setting(managed, "backoff-limit").source == "Kubernetes default"
    assert setting(managed, "ignore-disruptions").source == "annotation"


def test_provenance_guard_rail_lowers_the_kubernetes_default():
    item = one(manifest(), parse_config("guardRails: {maxBackoffLimit: 4}"))
    backoff = setting(item, "backoff-limit")
    assert backoff.value == "4"
    assert backoff.text == "cluster guard rail guardRails.maxBackoffLimit"
    assert any("spec.backoffLimit 6 -> 4" in change for change in item.changes)


def test_a_skipped_default_shows_as_off_with_the_reason():
    config = parse_config("defaults: {fail-non-retriable: true}")
    obj = manifest()
    obj["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    item = one(obj, config)
    assert setting(item, "fail-non-retriable").value == "false"
    assert any("fail-non-retriable (cluster default) skipped" in c for c in item.changes)


def test_policy_is_the_one_the_mutator_recorded():
    prepared, _ = cli.prepare(manifest(FULL), None)
    reviewed = engine.review(prepared, Config())
    assert set(reviewed.outcome.policies) == {"spec"}
    assert reviewed.outcome.policies["spec"].backoff_limit == 3


# --- failure rules in plain words ------------------------------------------------------------


def test_our_rules_in_order_with_their_origin():
    item = one(manifest(FULL | {P + "retriable-exit-codes": "143,137"}))
    first, second = item.rules
    assert (first.number, first.action, first.counts) == (1, "Ignore", False)
    assert first.when == (
        "the pod was disrupted (preemption, eviction, node drain, or the kubelet's "
        "node-pressure eviction)"
    )
    assert first.then == "retried, does not count"
    assert first.origin == "added by retry-policy for ignore-disruptions"
    assert second.when == "a non-zero exit code other than 137 or 143 in container main"
    assert (second.then, second.origin) == (
        "the Job fails at once",
        "added by retry-policy for fail-non-retriable",
    )
    assert item.no_match == "anything else (no rule matches): retried, counts against backoffLimit"


def test_user_rules_come_first_and_are_yours():
    spec = {
        "podFailurePolicy": {
            "rules": [
                {"action": "Count", "onExitCodes": {"operator": "In", "values": [3, 4, 5, 9]}},
                {
                    "action": "FailJob",
                    "onExitCodes": {"containerName": "main", "operator": "In", "values": [1]},
                },
                {"action": "FailJob", "onPodConditions": [{"type": "ConfigIssue"}]},
                {"action": "Ignore", "onPodConditions": [{"type": "Ready", "status": "False"}]},
            ]
        }
    }
    item = one(manifest({P + "ignore-disruptions": "true"}, spec=spec))
    texts = [(r.when, r.then, r.origin) for r in item.rules]
    assert texts == [
        (
            "exit codes 3-5 or 9 in any container",
            "retried, counts against backoffLimit",
            "your rule",
        ),
        ("exit code 1 in container main", "the Job fails at once", "your rule"),
        ("the pod has condition ConfigIssue", "the Job fails at once", "your rule"),
        ("the pod's condition Ready is False", "retried, does not count", "your rule"),
        (
            (
                "the pod was disrupted (preemption, eviction, node drain, or the kubelet's "
                "node-pressure eviction)"
            ),
            "retried, does not count",
            "added by retry-policy for ignore-disruptions",
        ),
    ]
    # The issue's own phrasing, from the examples of common failures:
    assert (
        "exit code 1 (application error) in container main: rule 2 matches; "
        "the Job fails at once (FailJob)" in item.examples
    )


def test_a_job_without_rules_says_every_failure_counts():
    item = one(manifest())
    assert item.rules == []
    assert (
        item.no_match
        == "there are no podFailurePolicy rules: every failure counts against backoffLimit"
    )


def test_common_failures_are_judged_by_the_shared_evaluation():
    item = one(manifest(FULL | {P + "retriable-exit-codes": "143"}))
    by_start = {e.split(":")[0]: e for e in item.examples}
    assert by_start["exit code 1 (application error) in container main"].endswith("(FailJob)")
    assert (
        "rule 2 matches; the Job fails at once"
        in by_start["exit code 137 (OOM kill or SIGKILL) in container main"]
    )
    assert (
        "no rule matches; retried, counts" in by_start["exit code 143 (SIGTERM) in container main"]
    )
    assert by_start["pod disrupted (preemption, eviction, drain; main exits 143)"].endswith(
        "rule 1 matches; retried, does not count (Ignore)"
    )


# --- the attempt plan --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backoff", "n"),
    [(3, 1), (3, 4), (0, 1), (5, 0), (2, 2), (1, 1)],
)
def test_plan_rows_and_boundaries(backoff, n):
    annotations = {P + "backoff-limit": str(backoff)}
    if n:
        annotations[P + "non-spot-attempts"] = str(n)
    item = one(manifest(annotations))
    plan = rows(item.attempts)
    assert [r.failures_before for r in plan] == list(range(backoff + 1))
    assert [r.attempt for r in plan] == list(range(1, backoff + 2))
    assert [r.nodes == "non-spot only" for r in plan] == [
        a >= backoff + 1 - n if n else False for a in range(backoff + 1)
    ]
    assert [r.retries_left for r in plan] == [backoff - a or None for a in range(backoff + 1)]
    assert plan[-1].if_fails == "the Job fails (BackoffLimitExceeded)"
    assert all(r.if_fails.startswith("retried") for r in plan[:-1])


@pytest.mark.parametrize(("backoff", "n"), [(3, 1), (2, 3), (4, 2)])
def test_plan_agrees_with_the_pod_webhook(backoff, n):
    """Each plan row's placement is what the real pod mutator does to that attempt's pod."""
    annotations = {P + "backoff-limit": str(backoff), P + "non-spot-attempts": str(n)}
    obj = manifest(annotations)
    prepared, _ = cli.prepare(obj, None)
    reviewed = engine.review(prepared, Config())
    template = reviewed.result["spec"]["template"]
    item = one(obj)
    for row in rows(item.attempts):
        pod_obj = pod(
            dict(template["metadata"]["annotations"]) | {P + "attempt": str(row.failures_before)},
            spec=copy.deepcopy(template["spec"]),
        )
        request = admission.decode(json.dumps(review(pod_obj)))
        verdict = engine.mutate(request, Config())
        placed = any(op["path"].startswith("/spec/affinity") for op in verdict.patch)
        assert placed is (row.nodes == "non-spot only"), row


def test_a_long_plan_keeps_its_ends_and_the_non_spot_boundary():
    item = one(manifest({P + "backoff-limit": "100", P + "non-spot-attempts": "2"}))
    shown = [r.failures_before for r in rows(item.attempts)]
    assert shown == [0, 1, 2, 98, 99, 100]
    gaps = [r for r in item.attempts.rows if isinstance(r, AttemptGap)]
    assert [(g.first, g.last) for g in gaps] == [(4, 98)]
    assert [r.nodes for r in rows(item.attempts)] == ["any node"] * 4 + ["non-spot only"] * 2
    text = explain.render_text([item])
    assert "(attempts 4 to 98: like the one above)" in text


def test_a_boundary_in_the_middle_of_a_long_plan_is_shown():
    item = one(manifest({P + "backoff-limit": "50", P + "non-spot-attempts": "20"}))
    shown = [r.failures_before for r in rows(item.attempts)]
    assert 30 in shown and 31 in shown  # 31 = 50 + 1 - 20, the first non-spot attempt
    by_attempt = {r.failures_before: r.nodes for r in rows(item.attempts)}
    assert (by_attempt[30], by_attempt[31]) == ("any node", "non-spot only")


def test_per_index_plan_uses_backoff_limit_per_index():
    spec = {"completions": 4, "completionMode": "Indexed", "backoffLimitPerIndex": 2}
    item = one(manifest({P + "ignore-disruptions": "true"}, spec=spec))
    assert item.attempts.limit_field == "spec.backoffLimitPerIndex"
    assert [r.failures_before for r in rows(item.attempts)] == [0, 1, 2]
    assert rows(item.attempts)[-1].if_fails == "the index fails"
    assert "backoffLimitPerIndex is 2" in item.budget


def test_per_index_plan_uses_the_index_budget():
    # With backoffLimitPerIndex, attempts are counted per index (the pod's
    # job-index-failure-count), so the plan is the per-index budget of 3 + 1 attempts.
    spec = {"completions": 4, "completionMode": "Indexed", "backoffLimitPerIndex": 3}
    item = one(manifest({P + "non-spot-attempts": "1"}, spec=spec))
    assert [r.nodes == "any node" for r in rows(item.attempts)] == [True, True, True, False]
    assert not any("no attempt runs on non-spot nodes" in note for note in item.notes)


def test_parallel_jobs_share_one_budget():
    item = one(manifest(spec={"completions": 5, "parallelism": 2}))
    assert any("all its pods share one budget" in note for note in item.notes)


# --- --simulate ---------------------------------------------------------------------------------


def test_simulate_failjob_ends_with_pod_failure_policy():
    item = one(example(), events="143,disruption,1")
    sim = item.simulation
    assert [s.counted for s in sim.steps] == [True, False, True]
    assert [s.action for s in sim.steps] == [None, "Ignore", "FailJob"]
    assert [s.attempt for s in sim.steps] == [1, 2, 2]  # an ignored failure is no new attempt
    assert (sim.ending.state, sim.ending.reason) == ("Failed", "PodFailurePolicy")


def test_simulate_backoff_limit_exceeded_on_the_failure_after_the_limit():
    sim = one(example(), events="137,143,143").simulation
    assert sim.ending.state == "Running"
    sim = one(example(), events="137,143,143,143").simulation
    assert (sim.ending.state, sim.ending.reason) == ("Failed", "BackoffLimitExceeded")
    assert [s.counted_failures for s in sim.steps] == [1, 2, 3, 4]
    # the example's last attempt (3 failures so far) runs on non-spot nodes
    assert [s.nodes for s in sim.steps] == ["any node"] * 3 + ["non-spot only"]


def test_simulate_still_running_says_what_comes_next():
    sim = one(example(), events="143,143").simulation
    assert (sim.ending.state, sim.ending.reason) == ("Running", None)
    assert (
        sim.ending.message == "attempt 3 runs next, on any node; 1 more counted failure is allowed"
    )
    sim = one(example(), events="143,143,143").simulation
    assert sim.ending.message.startswith("attempt 4 runs next, on non-spot nodes only")


def test_simulate_disruptions_do_not_count_with_ignore_disruptions():
    sim = one(example(), events=",".join(["disruption"] * 25)).simulation
    assert sim.ending.state == "Running"
    assert {s.counted_failures for s in sim.steps} == {0}
    assert {s.attempt for s in sim.steps} == {1}


def test_simulate_disruptions_count_without_an_ignore_rule():
    sim = one(manifest({P + "backoff-limit": "1"}), events="disruption,disruption").simulation
    assert (sim.ending.state, sim.ending.reason) == ("Failed", "BackoffLimitExceeded")


def test_simulate_with_backoff_limit_zero():
    sim = one(manifest({P + "backoff-limit": "0"}), events="143").simulation
    assert sim.ending.reason == "BackoffLimitExceeded"


def test_simulate_events_after_the_end_are_reported_unused():
    sim = one(example(), events="1,143,143").simulation
    assert len(sim.steps) == 1 and sim.unused == ["143", "143"]


def test_simulate_named_containers_and_oom():
    spec = {
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {"containerName": "main", "operator": "In", "values": [1, 137]},
                }
            ]
        }
    }
    obj = manifest(spec=spec, containers=("main", "sidecar"))
    sim = one(obj, events="sidecar:1,sidecar:oom").simulation
    assert [s.action for s in sim.steps] == [None, None]
    assert sim.ending.state == "Running"
    assert one(obj, events="oom").simulation.ending.reason == "PodFailurePolicy"


def test_simulate_fail_index_and_max_failed_indexes():
    spec = {
        "completions": 3,
        "completionMode": "Indexed",
        "backoffLimitPerIndex": 2,
        "podFailurePolicy": {
            "rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [42]}}]
        },
    }
    item = one(manifest(spec=spec), events="1,42")
    assert (item.simulation.ending.state, item.simulation.ending.reason) == (
        "IndexFailed",
        "FailedIndexes",
    )
    item = one(manifest(spec=spec), events="1,1,1")
    assert item.simulation.ending.state == "IndexFailed"
    assert "per-index limit" in item.simulation.ending.message
    strict = copy.deepcopy(spec) | {"maxFailedIndexes": 0}
    item = one(manifest(spec=strict), events="42")
    assert (item.simulation.ending.state, item.simulation.ending.reason) == (
        "Failed",
        "MaxFailedIndexesExceeded",
    )


def test_simulate_restart_policy_on_failure_counts_restarts():
    obj = manifest(spec={"backoffLimit": 2})
    obj["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    sim = one(obj, events="1").simulation
    assert sim.ending.state == "Running"
    sim = one(obj, events="1,1").simulation
    assert (sim.ending.state, sim.ending.reason) == ("Failed", "BackoffLimitExceeded")
    obj["spec"]["backoffLimit"] = 0
    assert one(obj, events="1").simulation.ending.reason == "BackoffLimitExceeded"


def test_simulate_does_not_apply_to_a_pod():
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "annotations": {
                P + "backoff-limit": "3",
                P + "non-spot-attempts": "1",
                P + "attempt": "3",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:1.36"}],
        },
    }
    item = one(obj, events="1")
    assert item.simulation is None
    assert any("--simulate does not apply to a Pod" in note for note in item.notes)
    assert "this pod is attempt 4: it runs on non-spot nodes only" in item.notes
    assert setting(item, "attempt").value == "3"


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ("", "no events given"),
        ("  ", "no events given"),
        ("143,256", "event 2 '256': exit codes go from 0 to 255"),
        ("143,boom", "event 2 'boom' is not an event"),
        ("1,,2", "event 2 '' is not an event"),
        ("-1", "event 1 '-1' is not an event"),
        ("Main:1", "event 1 'Main:1' is not an event"),
        ("main:", "event 1 'main:' is not an event"),
        ("1;2", "event 1 '1;2' is not an event"),
        ("Disruption", "event 1 'Disruption' names no category; the categories are"),
    ],
)
def test_bad_simulate_tokens_are_named_with_what_is_accepted(events, expected):
    with pytest.raises(explain.ExplainError) as caught:
        explain.parse_events(events)
    assert expected in str(caught.value)
    assert "accepted: an exit code 0-255" in str(caught.value)


def test_simulate_names_an_unknown_container():
    with pytest.raises(explain.ExplainError) as caught:
        explained(manifest(), events="143,sidecar:1")
    assert str(caught.value) == (
        "--simulate: event 2 'sidecar:1' names container 'sidecar', which Job/train does not "
        "have; its containers: main"
    )


def test_too_many_events():
    with pytest.raises(explain.ExplainError, match="at most 1000"):
        explain.parse_events(",".join(["1"] * 1001))


# --- text: 80 columns, and JSON that agrees ---------------------------------------------------


def wide_manifest():
    codes = ",".join(str(c) for c in range(100, 160))
    spec = {
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "Count",
                    "onExitCodes": {
                        "containerName": "a-very-long-container-name-for-the-trainer-process",
                        "operator": "In",
                        "values": list(range(1, 60)),
                    },
                }
            ]
        }
    }
    return manifest(
        FULL
        | {
            P + "retriable-exit-codes": codes,
            P + "backoff-limit": "40",
            P + "non-spot-attempts": "7",
        },
        spec=spec,
        containers=("a-very-long-container-name-for-the-trainer-process", "sidecar"),
        namespace="a-namespace-with-a-rather-long-name-for-testing",
        name="an-equally-long-job-name-that-keeps-going-and-going-on",
    )


CASES = {
    "example": (example(), "143,disruption,137,137,143"),
    "wide": (wide_manifest(), "1,2,a-very-long-container-name-for-the-trainer-process:3"),
    "plain": (manifest(), "143"),
    "per-index": (
        manifest(
            {P + "non-spot-attempts": "1"},
            spec={"completions": 2, "completionMode": "Indexed", "backoffLimitPerIndex": 1},
        ),
        "1,1",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_text_fits_80_columns(case):
    obj, events = CASES[case]
    text = explain.render_text(explained(obj, events=events))
    lines = text.splitlines()
    assert len(lines) > 20
    too_wide = [line for line in lines if len(line) > 80]
    assert too_wide == []


def test_denial_text_fits_80_columns_and_lists_every_problem():
    obj = manifest(
        {P + "backoff-limit": "x" * 60, P + "bakoff": "1", P + "non-spot-attempts": "-3"}
    )
    denial = explained(obj)
    assert isinstance(denial, explain.Denial)
    assert len(denial.problems) == 3
    text = explain.render_text([denial])
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "did you mean retry-policy.dev/backoff-limit?" in " ".join(text.split())


@pytest.mark.parametrize("case", sorted(CASES))
def test_json_and_text_agree(case):
    obj, events = CASES[case]
    (item,) = explained(obj, events=events)
    assert_text_and_json_agree(item)


def test_json_is_plain_data_with_the_simulation():
    items = explained(example(), events="1")
    data = json.loads(json.dumps(explain.to_json(items)))
    (item,) = data["items"]
    assert item["allowed"] is True
    assert item["simulation"]["outcome"] == {
        "state": "Failed",
        "reason": "PodFailurePolicy",
        "message": "pod 1 matched FailJob rule 2",
    }
    assert item["plan"]["rows"][0] == {
        "attempt": 1,
        "failuresBefore": 0,
        "nodes": "any node",
        "ifFails": "retried, 3 retries left",
        "retriesLeft": 3,
    }
    assert "simulator" not in item


# --- CLI ------------------------------------------------------------------------------------------


def test_cli_example_end_to_end_as_installed():
    result = subprocess.run(
        [str(BIN), "explain", "-f", str(EXAMPLE), "--simulate", "143,disruption,1"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Job ml/train-resnet\n")
    assert "reason PodFailurePolicy" in " ".join(result.stdout.split())
    assert result.stderr == ""


def test_cli_json_output():
    code, out, _ = run(["explain", "-f", str(EXAMPLE), "-o", "json", "--simulate", "143"])
    assert code == 0
    (item,) = json.loads(out)["items"]
    assert item["simulation"]["outcome"]["state"] == "Running"


def test_cli_denied_exits_1_and_prints_the_reasons():
    text = yaml.safe_dump(manifest({P + "backoff-limit": "lots"}, name="bad"))
    code, out, _ = run(["explain", "-f", "-"], stdin=text)
    assert code == 1
    assert "Job default/bad: retry-policy would deny it" in out
    assert "'lots' is not valid" in out
    code, out, _ = run(["explain", "-f", "-", "-o", "json"], stdin=text)
    assert code == 1 and json.loads(out)["items"][0]["allowed"] is False


def test_cli_unreadable_input_bad_events_and_bad_config_exit_2(tmp_path):
    assert run(["explain", "-f", str(tmp_path / "missing.yaml")])[0] == 2
    code, out, err = run(["explain", "-f", str(EXAMPLE), "--simulate", "1,x"])
    assert (code, out) == (2, "")
    assert "Error: --simulate: event 2 'x' is not an event" in err
    bad = tmp_path / "cluster.yaml"
    bad.write_text("defaults: {backoff-limit: many}")
    assert run(["explain", "-f", str(EXAMPLE), "--config", str(bad)])[0] == 2
    code, _, err = run(["explain", "-f", str(EXAMPLE), "--simulate", "ghost:1"])
    assert code == 2 and "names container 'ghost'" in err


def test_cli_namespace_and_config_reach_the_explanation(tmp_path):
    config = tmp_path / "cluster.yaml"
    config.write_text("namespaces: {research: {defaults: {backoff-limit: 8}}}")
    text = yaml.safe_dump(manifest())
    code, out, _ = run(
        ["explain", "-f", "-", "--config", str(config), "-n", "research", "-o", "json"], stdin=text
    )
    assert code == 0
    (item,) = json.loads(out)["items"]
    assert item["namespace"] == "research"
    assert item["plan"]["limit"] == 8


def test_cli_kinds_explain_does_not_cover_are_skipped_with_a_note():
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {},
    }
    text = yaml.safe_dump_all([deployment, manifest()])
    code, out, err = run(["explain", "-f", "-"], stdin=text)
    assert code == 0
    assert "Note: Deployment/d: explain does not cover this kind; skipped" in err
    assert out.startswith("Job default/train\n")


def test_every_mutated_kind_has_an_explainer():
    from webhook.kinds.registry import registered

    assert set(registered()) <= set(explain.explained_kinds())


# --- the pointer warning -------------------------------------------------------------------------


def mutate(obj, config=None):
    request = admission.decode(json.dumps(review(obj)))
    return engine.mutate(request, config or Config())


def test_kubectl_sees_the_changes_in_one_line_pointing_at_explain_once():
    """The API response carries one line for all the changes (with the pointer to
    explain and where its CLI is), then the warnings that say something is off; never
    on a reinvocation that changes nothing."""
    from testkit.builders import apply
    from webhook.admission.review import encode

    first = mutate(job(FULL))
    shown = encode("u", first)["response"]["warnings"]
    notes = first.warnings[first.changed :]
    assert first.changed >= 5 and notes
    assert shown == [engine.change_summary(first.changed), *notes]
    assert sum("retry-webhook explain" in w for w in shown) == 1
    assert "image" in shown[0] and len(shown[0]) < 130
    again = mutate(apply(job(FULL), first.patch))
    assert again.patch == [] and again.warnings == [] and not again.summary


def test_no_summary_without_a_change_or_for_a_controllers_pod():
    assert mutate(job()).warnings == []
    owner = {**job_owner(), "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"}
    owned = mutate(pod({P + "error-propagation": "earliest"}, owner=owner))
    assert owned.patch and not owned.summary


def test_explain_lists_the_changes_without_the_pointer():
    item = one(example())
    assert item.changes and all("retry-webhook explain" not in c for c in item.changes)
    assert item.changes[0] == "spec.backoffLimit 6 -> 3 (annotation retry-policy.dev/backoff-limit)"


# --- the docs show real output -------------------------------------------------------------


@pytest.mark.parametrize(
    ("marker", "argv"),
    [
        ("<!-- explain-output -->", ["explain", "-f", str(EXAMPLE)]),
        (
            "<!-- explain-simulate-output -->",
            ["explain", "-f", str(EXAMPLE), "--simulate", "137,disruption,143,1"],
        ),
    ],
)
def test_explain_page_output_is_what_the_command_prints(marker, argv):
    code, out, _ = run(argv)
    assert code == 0
    shown = doc_block(marker)
    if "--simulate" in argv:
        out = out[out.index("Simulation of") :]
    assert shown == out


def test_readme_worked_example_is_what_dry_run_prints():
    """The README's one worked example is examples/job.yaml (without its comment lines)
    and, unedited, what ``retry-webhook dry-run`` prints for it: the warnings kubectl
    would show on stderr, the admitted Job on stdout."""
    manifest_lines = EXAMPLE.read_text().splitlines(keepends=True)
    assert doc_block("<!-- worked-example-input -->", "README.md") == "".join(
        line for line in manifest_lines if not line.startswith("#")
    )
    code, out, err = run(["dry-run", "-f", str(EXAMPLE)])
    assert code == 0
    assert doc_block("<!-- worked-example-warnings -->", "README.md") == err
    assert doc_block("<!-- worked-example-output -->", "README.md") == out


def test_explain_job_spec_finds_a_nested_job_spec():
    """Kinds that embed JobSpecs (CronJob, JobSet) reuse explain_job_spec with their path."""
    from webhook.kinds.explaining import explain_job_spec
    from webhook.plan.explained import Subject
    from webhook.plan.outcome import Context

    spec = manifest({P + "backoff-limit": "2"})["spec"]
    prepared, _ = cli.prepare(manifest(), None)
    prepared["spec"] = {"replicatedJobs": [{"name": "w", "template": {"spec": spec}}]}
    subject = Subject(prepared, prepared, None, Context(Config()), [])
    for path in (
        ("spec", "replicatedJobs", "0", "template", "spec"),
        ("spec", "replicatedJobs[0]", "template", "spec"),
    ):
        item = explain_job_spec(subject, path, part="replicatedJob w")
        assert item.part == "replicatedJob w"
        assert item.attempts.limit_field == ".".join(path) + ".backoffLimit"
        assert [r.failures_before for r in rows(item.attempts)] == list(range(7))
    missing = explain_job_spec(subject, ("spec", "replicatedJobs", "5", "template", "spec"))
    assert missing.attempts is None and "is missing" in missing.notes[0]
