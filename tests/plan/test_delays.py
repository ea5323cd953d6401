"""Between attempts, at admission: ``attempt-env`` (the attempt inside the container) and
``retry-delay`` (a scheduling gate until the delay after the previous failure has passed).

The engine runs as the server runs it (view, memo, ``RPW_CHECK_VIEWS``), with the real
failure history (``FailureHistory``, fed failed pods) and a leadership note; the
controller's side, the server and the chart are in tests/controller/test_gates.py.
"""

from __future__ import annotations

import copy
import json
from fractions import Fraction

import pytest

from testkit.builders import P, apply, job, pod, review, stored
from testkit.delays import (
    DELAY,
    NO_CONFIG,
    NOW,
    Source,
    admit,
    fixed_time,  # noqa: F401 - fixture
    job_pod,
)
from webhook.admission import engine
from webhook.admission import review as admission
from webhook.cluster import events
from webhook.cluster.attempts import AttemptLookup
from webhook.kube import gates
from webhook.plan import delays as between
from webhook.policy.config import ConfigError, parse_config
from webhook.policy.grammar import (
    BadValue,
    format_duration,
    format_time,
    parse_delay_factor,
    parse_duration,
    parse_time,
)
from webhook.policy.model import Delays, Scope, format_value, parse_annotations

RESTART = "jobset.sigs.k8s.io/restart-attempt"


def env(obj: dict, container: int = 0) -> dict[str, str]:
    return between.env_in(obj["spec"]["containers"][container])


# --- grammars --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds", "canonical"),
    [
        ("30s", 30, "30s"),
        ("5m", 300, "5m"),
        ("1h", 3600, "1h"),
        ("1h30m", 5400, "1h30m"),
        ("90s", 90, "1m30s"),
        ("168h", 168 * 3600, "168h"),
    ],
)
def test_durations_parse_and_print_back(text, seconds, canonical):
    assert parse_duration(text) == seconds
    assert format_duration(seconds) == canonical
    assert parse_duration(format_value("retry-delay", seconds)) == seconds


@pytest.mark.parametrize("text", ["", "0s", "30", "1.5m", "5M", "1m1h", "169h", "-5s", " 5m", "1d"])
def test_bad_durations_say_what_is_accepted(text):
    with pytest.raises(BadValue, match=r"accepted: a duration from 1s to 168h .* e\.g\. 30s, 5m"):
        parse_duration(text)


def test_a_bad_delay_annotation_is_denied_with_key_value_and_accepted():
    verdict, _ = admit(job({P + "retry-delay": "5 minutes", P + "retry-delay-factor": "0.5"}))
    assert not verdict.allowed
    assert "annotation retry-policy.dev/retry-delay: '5 minutes' is not valid; accepted: a " in (
        verdict.message
    )
    assert (
        "annotation retry-policy.dev/retry-delay-factor: '0.5' is not valid; accepted: a "
        "decimal number of at least 1"
    ) in verdict.message


def test_factor_none_and_not_before_grammars():
    assert parse_delay_factor("1") == 1 and parse_delay_factor("1.5") == Fraction(3, 2)
    for bad in ("0.9", "none", "2.0001", "1e2"):
        with pytest.raises(BadValue):
            parse_delay_factor(bad)
    assert parse_duration("none") is None  # turns off a default
    assert format_time(parse_time("2026-11-26T10:00:00Z")) == "2026-11-26T10:00:00Z"
    assert format_time(parse_time("2026-11-26T10:00:00Z") + 0.1) == "2026-11-26T10:00:01Z"
    for bad in ("2026-11-26T10:00:00+00:00", "2026-11-26 10:00:00Z", "2026-13-01T00:00:00Z"):
        with pytest.raises(BadValue, match="RFC 3339 time in UTC"):
            parse_time(bad)
    # not-before is the webhook's: a Pod's annotation, never a default or a workload's.
    _, problems = parse_annotations({gates.NOT_BEFORE: "2026-11-26T10:00:00Z"}, Scope.POD)
    assert problems == []
    _, problems = parse_annotations({gates.NOT_BEFORE: "soon"}, Scope.WORKLOAD)
    assert [p.reason for p in problems] == ["wrong-scope"]


def test_delays_grow_by_the_factor_up_to_the_cap_and_add_up():
    delays = Delays(30, Fraction(2), 300)
    assert [delays.seconds(n) for n in range(8)] == [0, 30, 60, 120, 240, 300, 300, 300]
    assert delays.total(6) == 30 + 60 + 120 + 240 + 300 + 300
    assert delays.total(2_147_483_647) == 450 + 300 * (2_147_483_647 - 4)  # no loop to 2^31
    # Exact decimals: 100 x 1.1^2 is 121 (not 121.00000000000003 rounded up to 122).
    assert [Delays(100, Fraction("1.1"), 10**6).seconds(n) for n in (1, 2, 3, 4)] == [
        100,
        110,
        121,
        134,
    ]
    assert Delays(30, Fraction(1), 300).seconds(10**9) == 30


# --- guard rail --------------------------------------------------------------------------------


def test_the_guard_rail_caps_what_an_annotation_may_ask():
    config = parse_config("guardRails: {maxRetryDelay: 10m}")
    assert config.guard_rails.max_retry_delay == 600
    verdict, _ = admit(job({P + "retry-delay": "1h"}), config=config)
    assert not verdict.allowed and verdict.code == 403
    assert (
        "annotation retry-policy.dev/retry-delay: 1h is above this cluster's limit; accepted: "
        "a duration up to 10m (guardRails.maxRetryDelay)"
    ) in verdict.message
    verdict, _ = admit(job({P + "retry-delay": "1m", P + "retry-delay-max": "2h"}), config=config)
    assert "annotation retry-policy.dev/retry-delay-max: 2h is above" in verdict.message
    # Growth by the factor stops at the rail when no retry-delay-max is set.
    verdict, _out = admit(
        job({P + "retry-delay": "1m", P + "retry-delay-factor": "4"}), config=config
    )
    assert verdict.allowed
    assert "retry-policy: retries wait 1m x4 per failure, at most 10m, after a failure; " in (
        " ".join(verdict.warnings)
    )


def test_a_default_above_the_guard_rail_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        parse_config(
            "defaults: {retry-delay: 2h}\n"
            "guardRails: {maxRetryDelay: 1h}\n"
            "namespaces: {ml: {guardRails: {maxRetryDelay: 30m}, defaults: {retry-delay-max: 45m}}}"
        )
    text = str(err.value)
    assert "defaults.retry-delay: 2h is above the guard rail maxRetryDelay=1h" in text
    assert "namespaces.ml.defaults.retry-delay-max: 45m is above the guard rail " in text
    with pytest.raises(ConfigError, match="maxRetryDelay: 3600 is not valid; accepted: a dur"):
        parse_config("guardRails: {maxRetryDelay: 3600}")


def test_a_controller_pod_above_a_rail_lowered_since_is_capped_not_refused():
    """The Job was admitted under an older config; its pod waits what the rail allows."""
    source = Source(failures=1)
    made = job_pod({P + "retry-delay": "1h"})
    source.fail(made, NOW - 10)
    config = parse_config("guardRails: {maxRetryDelay: 5m}")
    verdict, out = admit(made, source, config=config)
    assert verdict.allowed
    assert gates.not_before(out) == format_time(NOW - 10 + 300)


# --- workloads ------------------------------------------------------------------------------------


def test_a_job_copies_the_settings_to_its_pods_and_says_what_they_do():
    verdict, out = admit(
        job(
            {
                P + "retry-delay": "30s",
                P + "retry-delay-factor": "2",
                P + "retry-delay-max": "5m",
                P + "attempt-env": "true",
                P + "backoff-limit": "3",
            }
        )
    )
    assert verdict.allowed, verdict.message
    assert out["spec"]["template"]["metadata"]["annotations"] == {
        P + "backoff-limit": "3",
        P + "attempt-env": "true",
        P + "retry-delay": "30s",
        P + "retry-delay-factor": "2",
        P + "retry-delay-max": "5m",
    }
    assert verdict.warnings[:3] == [
        "retry-policy: spec.backoffLimit 6 -> 3 (annotation retry-policy.dev/backoff-limit)",
        "retry-policy: its pods' containers get env RETRY_POLICY_ATTEMPT, "
        "RETRY_POLICY_MAX_ATTEMPTS, RETRY_POLICY_LAST_FAILURE",
        "retry-policy: retries wait 30s x2 per failure, at most 5m, after a failure; the Job "
        "controller's back-off still applies",
    ]
    assert all(len(w) < 120 for w in verdict.warnings)
    assert json.loads(out["metadata"]["annotations"][P + "applied"]) == {
        "attemptEnv": True,
        "backoffLimit": 3,
        "retryDelay": "30s",
        "retryDelayFactor": "2",
        "retryDelayMax": "5m",
        "v": 2,
    }
    again, twice = admit(out)
    assert again.patch == [] and twice == out


def test_delays_that_outlast_the_deadline_are_warned_of():
    annotations = {P + "retry-delay": "1m", P + "retry-delay-factor": "2", P + "backoff-limit": "3"}
    verdict, _ = admit(job(annotations, spec={"activeDeadlineSeconds": 360}))
    # 1m + 2m + 4m = 7m of waiting alone, over a 6 minute deadline.
    assert (
        "retry-policy: 3 retries wait 7m (retry-delay), longer than spec.activeDeadlineSeconds "
        "360: the deadline comes first"
    ) in verdict.warnings
    verdict, _ = admit(job(annotations, spec={"activeDeadlineSeconds": 420}))
    assert not any("deadline comes first" in w for w in verdict.warnings)


def test_a_max_below_the_delay_and_on_failure_pods_are_refused():
    verdict, _ = admit(job({P + "retry-delay": "5m", P + "retry-delay-max": "1m"}))
    assert (
        "annotation retry-policy.dev/retry-delay-max: 1m is below retry-delay 5m; accepted: a "
        "duration of at least 5m"
    ) in verdict.message
    verdict, _ = admit(job(DELAY, restart_policy="OnFailure"))
    assert (
        "annotation retry-policy.dev/attempt-env and annotation retry-policy.dev/retry-delay: "
        "spec.template.spec.restartPolicy is OnFailure"
    ) in verdict.message
    verdict, _ = admit(job({P + "retry-delay-factor": "2"}))
    assert "retry-policy: retry-delay-factor has no effect without retry-delay" in verdict.warnings


def test_kinds_whose_pods_carry_no_attempt_deny_it():
    from testkit.workloads import admitted

    rayjob = admitted(
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "metadata": {"name": "r", "namespace": "ml", "annotations": dict(DELAY)},
            "spec": {"entrypoint": "python x.py", "rayClusterSpec": {"headGroupSpec": {}}},
        }
    )
    verdict, _ = admit(rayjob)
    assert "annotation retry-policy.dev/retry-delay: cannot apply to a RayJob" in verdict.message
    assert "annotation retry-policy.dev/attempt-env: cannot apply to a RayJob" in verdict.message


# --- a Job's pods --------------------------------------------------------------------------------


def test_a_retry_is_gated_until_the_delay_after_the_failure_and_told_its_attempt():
    source = Source(failures=1, budget=3)
    first = job_pod()
    source.fail(first, NOW - 10, code=3)
    made = job_pod()
    made["spec"]["containers"].append(
        {"name": "sidecar", "image": "x", "env": [{"name": between.ATTEMPT, "value": "mine"}]}
    )
    verdict, out = admit(made, source)
    assert verdict.allowed, verdict.message
    stamp = format_time(NOW - 10 + 30)
    assert out["spec"]["schedulingGates"] == [{"name": "retry-policy.dev/retry-delay"}]
    assert gates.not_before(out) == stamp
    assert out["metadata"]["labels"][gates.GATED_LABEL] == "true"
    assert env(out) == {
        between.ATTEMPT: "1",
        between.MAX_ATTEMPTS: "4",
        between.LAST_FAILURE: "exit-code:3:main",
    }
    assert env(out, 1)[between.ATTEMPT] == "mine"  # the user's own value stays
    assert verdict.decisions == (("RetryDelayed", f"attempt 2 of 4: waits 30s until {stamp}"),)
    assert f"retry-policy: attempt 2 of 4 waits 30s after the failure: gated until {stamp}" in (
        verdict.warnings
    )
    assert "retry-policy: kept your own RETRY_POLICY_ATTEMPT in containers sidecar" in (
        verdict.warnings
    )
    again, twice = admit(out, source)  # a reinvocation changes nothing
    assert again.patch == [] and twice == out
    assert engine.validate(admission.decode(json.dumps(review(out))), parse_config("{}")).allowed


def test_a_retry_whose_delay_is_over_runs_at_once():
    source = Source(failures=2)
    made = job_pod({P + "retry-delay-factor": "2"})
    source.fail(made, NOW - 100)
    source.fail(made, NOW - 61, oom=True)  # the second retry waits 60s: over
    verdict, out = admit(made, source)
    assert "schedulingGates" not in out["spec"] and verdict.decisions == ()
    assert env(out)[between.LAST_FAILURE] == "oom-killed:main"
    source.failures = 3
    source.fail(made, NOW - 100)  # an earlier failure, seen late: the latest still counts
    verdict, out = admit(made, source)
    assert gates.not_before(out) == format_time(NOW - 61 + 120)


def test_the_first_attempt_is_not_delayed_and_is_told_it_is_the_first():
    _verdict, out = admit(job_pod(), Source(failures=0))
    assert "schedulingGates" not in out["spec"]
    assert env(out) == {between.ATTEMPT: "0", between.MAX_ATTEMPTS: "7", between.LAST_FAILURE: ""}


def test_no_leader_no_gate_a_warning_and_a_warning_event():
    source = Source(failures=1)
    made = job_pod()
    source.fail(made, NOW - 1)
    verdict, out = admit(made, source, live=False)
    assert verdict.allowed and "schedulingGates" not in out["spec"]
    assert gates.NOT_BEFORE not in out["metadata"]["annotations"]
    assert verdict.decisions == (
        (
            "RetryDelaySkipped",
            "attempt 2 of 7: not held back for its 30s retry-delay: no controller of the "
            "webhook leads to end it; it runs at once",
        ),
    )
    assert events.decision_type("RetryDelaySkipped") == "Warning"
    assert (
        "retry-policy: attempt 2 of 7 not held back for its 30s retry-delay: no controller "
        "leads to end it"
    ) in verdict.warnings
    assert env(out)[between.ATTEMPT] == "1"  # attempt-env needs no controller


def test_no_leader_is_told_even_when_the_delay_was_the_only_change():
    """Nothing else changes the pod, so the patch is empty: the warning and the Event
    must not depend on a patch (``emit_decisions`` writes them)."""
    source = Source(failures=1)
    made = job_pod({P + "attempt-env": "false"})
    source.fail(made, NOW - 1)
    live, _ = admit(made, source)
    assert [d[0] for d in live.decisions] == ["RetryDelayed"]
    verdict, out = admit(made, source, live=False)
    assert verdict.patch == [] and out == made
    assert [d[0] for d in verdict.decisions] == ["RetryDelaySkipped"]
    assert any("no controller leads to end it" in w for w in verdict.warnings)


def test_a_remembered_gate_is_not_replayed_under_another_leadership_or_time(fixed_time):  # noqa: F811
    """The memo keys on the pod's view; leadership and time are recorded lookups, so a
    verdict is replayed only while both answer as they did."""
    source = Source(failures=1)
    made = job_pod({P + "attempt-env": "false"})
    source.fail(made, NOW - 10)
    gated, _ = admit(made, source)
    assert gated.patch and engine.MEMO.stats()["entries"] == 1
    again, _ = admit(copy.deepcopy(made), source)
    assert again.patch == gated.patch and engine.MEMO.stats()["hits"] == 1
    _, out = admit(made, source, live=False)  # only the leadership changed
    assert "schedulingGates" not in out["spec"]
    _, out = admit(made, source)
    assert out["spec"]["schedulingGates"] == [{"name": gates.GATE}]
    fixed_time[0] = NOW + 25  # only the time changed: the delay (to NOW + 20) is over
    _, out = admit(made, source)
    assert "schedulingGates" not in out["spec"]
    assert engine.MEMO.stats()["hits"] == 1


# --- each kind's attempt ----------------------------------------------------------------------


def test_an_indexed_job_with_a_budget_per_index_counts_per_index():
    made = job_pod({P + "backoff-limit": "2"}, index=3, index_failures=1)
    source = Source(failures=5, budget=2_147_483_647)  # the Job's: every index together
    source.fail(made, NOW - 5)
    _verdict, out = admit(made, source)
    assert env(out) == {
        between.ATTEMPT: "1",
        between.MAX_ATTEMPTS: "3",  # backoffLimitPerIndex 2 + 1, copied to the template
        between.LAST_FAILURE: "exit-code:1:main",
    }
    assert gates.not_before(out) == format_time(NOW - 5 + 30)


def test_an_indexed_job_sharing_its_budget_counts_the_index_failures_it_saw():
    source = Source(failures=3)
    other = job_pod(index=0)
    for at in (NOW - 100, NOW - 90):
        source.fail(other, at)
    mine = job_pod(index=1)
    source.fail(mine, NOW - 20, code=7)
    _, out = admit(mine, source)
    assert env(out) == {between.ATTEMPT: "1", between.LAST_FAILURE: "exit-code:7:main"}
    assert gates.not_before(out) == format_time(NOW + 10)
    fresh = job_pod(index=2)
    _verdict, out = admit(fresh, source)
    assert env(out) == {between.ATTEMPT: "0", between.LAST_FAILURE: ""}
    assert "schedulingGates" not in out["spec"]


def test_a_jobset_pod_counts_restarts_and_waits_from_the_failure_that_restarted_it():
    labels = {
        "jobset.sigs.k8s.io/jobset-uid": "set-1",
        "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        "jobset.sigs.k8s.io/job-index": "0",
    }
    source = Source(failures=0)
    ran = job_pod({P + "backoff-limit": "3"}, uid="child-1", labels={**labels, RESTART: "0"})
    source.fail(ran, NOW - 4, code=2, uid="child-1")
    # Run 1: new child Jobs (new UIDs), another replicated Job: told the set's failure.
    other = {**labels, "jobset.sigs.k8s.io/replicatedjob-name": "driver", RESTART: "1"}
    made = job_pod({P + "backoff-limit": "3"}, uid="child-2", labels=other)
    _verdict, out = admit(made, source)
    assert env(out) == {
        between.ATTEMPT: "1",
        between.MAX_ATTEMPTS: "4",  # maxRestarts 3 + 1
        between.LAST_FAILURE: "exit-code:2:main",
    }
    assert gates.not_before(out) == format_time(NOW - 4 + 30)


def test_a_bare_pod_waits_from_its_admission_and_needs_its_attempt():
    made = pod({**DELAY, P + "attempt": "2", P + "backoff-limit": "4"}, name="step-3")
    verdict, out = admit(made)
    assert gates.not_before(out) == format_time(NOW + 30)
    assert env(out) == {between.ATTEMPT: "2", between.MAX_ATTEMPTS: "5", between.LAST_FAILURE: ""}
    assert (
        "retry-policy: attempt 3 of 5 waits 30s from admission (previous failure: a bare "
        "Pod's is not known): gated until " + gates.not_before(out)
    ) in verdict.warnings
    verdict, _ = admit(pod(DELAY, name="step-1"))
    assert not verdict.allowed
    assert (
        "annotation retry-policy.dev/retry-delay: a Pod no controller made needs "
        "retry-policy.dev/attempt, its attempt number (failures so far)"
    ) in verdict.message


def test_a_pod_whose_attempt_is_unknown_is_not_gated():
    class Unknown(Source):
        def job_failures(self, namespace, name, uid):
            return AttemptLookup(None, "none", "Job ml/train unreadable: HTTP 503")

    source = Unknown()
    verdict, out = admit(job_pod(), source)
    assert "schedulingGates" not in out["spec"]
    assert (
        "retry-policy: not delayed: the attempt number is unknown (Job ml/train unreadable: "
        "HTTP 503)"
    ) in verdict.warnings
    assert (
        "retry-policy: RETRY_POLICY_ATTEMPT not set: the attempt number is unknown (Job "
        "ml/train unreadable: HTTP 503)"
    ) in verdict.warnings


def test_a_gate_of_someone_else_stays_and_ours_goes_after_it():
    source = Source(failures=1)
    made = job_pod()
    made["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    source.fail(made, NOW - 1)
    _, out = admit(made, source)
    assert out["spec"]["schedulingGates"] == [
        {"name": "kueue.x-k8s.io/admission"},
        {"name": gates.GATE},
    ]
    patch = gates.release_patch(stored(out))
    assert patch[:2] == [
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": gates.GATE},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
    ]
    released = apply(stored(out), patch)
    assert released["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
    assert gates.GATED_LABEL not in released["metadata"]["labels"]
    assert not gates.held(released) and gates.release_patch(released) == []


# --- explain and --simulate -------------------------------------------------------------------


def test_explain_shows_each_attempts_delay_as_the_pod_webhook_gives_it():
    from webhook import cli, explain

    policy = {
        P + "retry-delay": "30s",
        P + "retry-delay-factor": "2",
        P + "retry-delay-max": "1m30s",
        P + "backoff-limit": "4",
    }
    prepared, _ = cli.prepare(job(policy, default=False), None)
    (item,) = explain.explain(prepared, NO_CONFIG, None, explain.parse_events("1,1,1"))
    assert [row.waits for row in item.attempts.rows] == ["-", "30s", "1m", "1m30s", "1m30s"]
    rows = explain.to_json([item])["items"][0]["plan"]["rows"]
    assert [row["waits"] for row in rows] == ["-", "30s", "1m", "1m30s", "1m30s"]
    text = explain.render_text([item])
    assert "  attempt  failures so far  runs on        waits   if it fails (counted)" in text
    assert "  pod 2 (attempt 2, any node, after 30s): " in text
    sim = item.simulation
    simulated = [s.facts.delay_seconds for s in sim.steps] + [sim.next.facts.delay_seconds]
    assert simulated == [0, 30, 60, 90]
    # The pod webhook, after as many failures, holds each pod back as long.
    for failures, expected in enumerate(simulated):
        source = Source(failures=failures, budget=4)
        made = job_pod({**policy, P + "attempt-env": "false"})
        for n in range(failures):  # the last a second ago
            source.fail(made, NOW - failures + n)
        _, out = admit(made, source)
        waited = parse_time(gates.not_before(out)) - (NOW - 1) if failures else 0
        assert waited == expected, failures


def test_explain_without_delays_keeps_its_plan_as_it_was():
    from webhook import cli, explain

    prepared, _ = cli.prepare(job({P + "backoff-limit": "2"}, default=False), None)
    (item,) = explain.explain(prepared, NO_CONFIG, None, None)
    assert not item.attempts.delays and "waits" not in explain.render_text([item])
    assert "waits" not in explain.to_json([item])["items"][0]["plan"]["rows"][0]


def test_every_pod_the_webhook_changes_is_valid_and_patched_as_go_patches_it(tmp_path):
    """Each kind's pod, gated and told its attempt: the patch applied by Go's json-patch
    (``kubectl patch --local``) gives what the engine says, valid under the strict 1.35 and
    1.36 schemas."""
    from testkit.workloads import kubectl_patch, validate_schema

    source = Source(failures=1, budget=3)
    job_made = job_pod()
    source.fail(job_made, NOW - 1)
    queued = job_pod()
    queued["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    queued["metadata"]["labels"] = {"app": "train"}
    indexed = job_pod({P + "backoff-limit": "2"}, index=0, index_failures=1)
    bare = pod({**DELAY, P + "attempt": "1"}, name="step-2")
    bare["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox:1.36"}]
    for made in (job_made, queued, indexed, bare):
        verdict, expected = admit(made, source)
        assert verdict.allowed and gates.gate_index(expected) is not None
        by_go = kubectl_patch(made, verdict.patch, tmp_path)
        assert by_go == expected
        for version in ("1.35", "1.36"):
            validate_schema(by_go, version)
    assert between.env_in(by_go["spec"]["initContainers"][0])[between.ATTEMPT] == "1"
