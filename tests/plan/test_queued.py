"""``retry-delay`` on workloads Kueue queues: the ``kueue`` config section (Kueue's
``waitForPodsReady`` as the admin states it), and the warning, cap or denial at admission
(``webhook.plan.queued``), through the engine, the CLI and the real server."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from testkit.builders import P, apply, decode_patch, job, review
from testkit.cli import run
from testkit.delays import NOW, Source, admit, fixed_time, job_pod  # noqa: F401 - fixture
from testkit.kinds import cronjob, jobset
from testkit.servers import start, stop
from testkit.workloads import assert_idempotent, mutate, validate
from webhook.admission import engine
from webhook.admission import review as admission
from webhook.kube import gates
from webhook.kube.wellknown import QUEUE_LABEL
from webhook.policy.config import ConfigError, parse_config
from webhook.policy.grammar import format_time
from webhook.policy.kueue import DEFAULT_TIMEOUT, Kueue, parse_go_duration

TEN_MINUTES = {P + "retry-delay": "10m", P + "backoff-limit": "3"}
#: Kueue evicts past recoveryTimeout 5m; a released pod needs 1m: a retry may wait 4m.
STATED = "kueue: {waitForPodsReady: {timeout: 10m, recoveryTimeout: 5m}}"
DENY = "kueue: {waitForPodsReady: {timeout: 10m, recoveryTimeout: 5m}, retryDelay: deny}"


def queued(obj: dict, queue: str = "team-a") -> dict:
    """``obj`` queued in a LocalQueue, as a user labels it for Kueue."""
    obj["metadata"].setdefault("labels", {})[QUEUE_LABEL] = queue
    return obj


def notes(verdict) -> list[str]:
    return [w for w in verdict.warnings if "Kueue" in w]


# --- the config ----------------------------------------------------------------------------


def test_go_durations_are_read_as_kueue_reads_its_config():
    # upstream: metav1.Duration is read with time.ParseDuration (Go's grammar: decimals,
    # several units, ns to h, a bare 0).
    cases = {
        "5m": 300,
        "1h30m": 5400,
        "1.5h": 5400,
        "90s": 90,
        "300ms": Decimal("0.3"),
        "1m0.5s": Decimal("60.5"),
        "0": 0,
        "0s": 0,
        "2\u00b5s": Decimal("0.000002"),
    }
    for text, seconds in cases.items():
        assert parse_go_duration(text) == seconds, text
    for bad in ("", "5", "m", "-5m", "+5m", "5 m", "1d", ".s"):
        with pytest.raises(ValueError, match="is not a duration"):
            parse_go_duration(bad)


def test_the_config_takes_kueues_own_defaults():
    """Unstated timeouts are Kueue's (``SetDefaults_Configuration`` in
    apis/config/v1beta2/defaults.go: timeout 30m, recoveryTimeout the timeout); a
    recoveryTimeout of 0s turns recovery checking off (``waitForPodsReady`` in
    pkg/controller/core/core.go keeps it only when > 0)."""
    assert parse_config("{}").kueue == Kueue()
    assert not Kueue().stated
    kueue = parse_config("kueue: {waitForPodsReady: {}}").kueue
    assert (kueue.stated, kueue.enabled, kueue.timeout, kueue.recovery_timeout) == (
        True,
        True,
        DEFAULT_TIMEOUT,
        DEFAULT_TIMEOUT,
    )
    assert kueue.retry_delay == "cap" and kueue.startup_allowance == 60
    assert parse_config("kueue: {waitForPodsReady: {timeout: 0s}}").kueue.timeout == 30 * 60
    off = parse_config("kueue: {waitForPodsReady: {timeout: 10m, recoveryTimeout: 0s}}").kueue
    assert off.bound() == (600, "timeout 10m") and off.longest_wait() == 540


def test_the_bound_is_the_timeout_that_runs_out_first():
    """``admittedNotReadyWorkload`` (pkg/controller/core/workload_controller.go): a
    workload that was ready and lost a pod is evicted past recoveryTimeout; one not
    ready since its admission, past timeout. A retry can be either."""
    kueue = parse_config(STATED).kueue
    assert kueue.bound() == (300, "recoveryTimeout 5m") and kueue.longest_wait() == 240
    longer = parse_config("kueue: {waitForPodsReady: {timeout: 5m, recoveryTimeout: 1h}}")
    assert longer.kueue.bound() == (300, "timeout 5m")
    sub_second = parse_config("kueue: {waitForPodsReady: {timeout: 90.9s}}").kueue
    assert sub_second.timeout == 90  # rounded down: the safe side


def test_every_mistake_in_the_kueue_section_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        parse_config(
            "kueue:\n"
            "  waitForPodsReady: {timout: 5m, timeout: 300, recoveryTimeout: -1m, enable: maybe}\n"
            "  startupAllowance: 1 minute\n"
            "  retryDelay: warn\n"
            "  queue: x\n"
        )
    text = str(err.value)
    for expected in (
        "kueue.waitForPodsReady.timout: unknown key; did you mean timeout?",
        "kueue.waitForPodsReady.timeout: 300 is not a quoted duration; accepted: a Go "
        "duration such as 5m, 1h30m or 90s",
        "kueue.waitForPodsReady.recoveryTimeout: '-1m' is not a duration",
        "kueue.waitForPodsReady.enable: 'maybe' is not true or false",
        "kueue.startupAllowance: '1 minute' is not a duration",
        "kueue.retryDelay: 'warn' is not valid; accepted: cap or deny",
        "kueue.queue: unknown key",
    ):
        assert expected in text, text
    with pytest.raises(ConfigError, match=r"kueue.startupAllowance: 5m leaves no time to wait "):
        parse_config("kueue: {waitForPodsReady: {timeout: 5m}, startupAllowance: 5m}")
    with pytest.raises(ConfigError, match=r"kueue: must be a mapping"):
        parse_config("kueue: cap")


def test_check_config_validates_the_kueue_section_and_says_what_it_means(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(STATED + "\n")
    code, out, _ = run(["check-config", str(good)])
    assert code == 0
    assert (
        "kueue: a retry waits at most 4m (waitForPodsReady recoveryTimeout 5m less "
        "startupAllowance 1m); a longer retry-delay is capped"
    ) in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("kueue: {waitForPodsReady: {timeout: 10}}\n")
    code, _, err = run(["check-config", str(bad)])
    assert code == 1 and "kueue.waitForPodsReady.timeout: 10 is not a quoted duration" in err


# --- admission --------------------------------------------------------------------------------


def test_a_queued_job_without_stated_timeouts_is_warned_of_wait_for_pods_ready():
    verdict, out = admit(queued(job(TEN_MINUTES)))
    assert verdict.allowed, verdict.message
    assert notes(verdict) == [
        "retry-policy: queued by Kueue (kueue.x-k8s.io/queue-name: team-a): while a retry "
        "waits (up to 10m, retry-delay) the workload is PodsReady=False, and Kueue's "
        "waitForPodsReady evicts and requeues it whole past its timeout (30m by default) or "
        "recoveryTimeout; state them in the webhook's config (kueue.waitForPodsReady) to "
        "have retry-delay checked"
    ]
    assert out["spec"]["template"]["metadata"]["annotations"][P + "retry-delay"] == "10m"
    # Not queued, or Kueue's check said off: nothing about Kueue.
    assert notes(admit(job(TEN_MINUTES))[0]) == []
    off = parse_config("kueue: {waitForPodsReady: {enable: false}}")
    assert notes(admit(queued(job(TEN_MINUTES)), config=off)[0]) == []


def test_delays_within_the_timeouts_are_said_to_fit():
    annotations = {P + "retry-delay": "1m", P + "retry-delay-factor": "2", P + "backoff-limit": "3"}
    verdict, out = admit(queued(job(annotations)), config=parse_config(STATED))
    # 1m, 2m, 4m: the third retry waits exactly what Kueue leaves.
    assert notes(verdict) == [
        "retry-policy: queued by Kueue (kueue.x-k8s.io/queue-name: team-a): a retry waits at "
        "most 4m (retry-delay), within Kueue's waitForPodsReady recoveryTimeout 5m less 1m to "
        "start (kueue.startupAllowance)"
    ]
    assert P + "retry-delay-max" not in out["spec"]["template"]["metadata"]["annotations"]


def test_a_longer_delay_is_capped_with_the_cap_and_why():
    config = parse_config(STATED)
    verdict, out = admit(queued(job(TEN_MINUTES)), config=config)
    assert verdict.allowed, verdict.message
    assert (
        "retry-policy: retry-delay capped at 4m (a retry would wait 10m), as queued by Kueue "
        "(kueue.x-k8s.io/queue-name: team-a): past Kueue's waitForPodsReady recoveryTimeout "
        "5m a workload whose retry is held back (PodsReady=False) is evicted and requeued "
        "whole, and a released pod needs 1m to start (kueue.startupAllowance)"
    ) in verdict.warnings
    # The pods carry the cap (they read their policy from the template), the user's
    # annotation stays as written.
    assert out["spec"]["template"]["metadata"]["annotations"] == {
        P + "retry-delay": "4m",
        P + "retry-delay-max": "4m",
    }
    assert out["metadata"]["annotations"][P + "retry-delay"] == "10m"
    assert json.loads(out["metadata"]["annotations"][P + "applied"])["retryDelayMax"] == "4m"
    assert_idempotent(queued(job(TEN_MINUTES)), config)


def test_a_retry_of_a_capped_job_waits_the_cap():
    """The Job's pod, made from the capped template, is gated for the cap after the
    failure, not for the 10m asked."""
    _, capped = admit(queued(job(TEN_MINUTES)), config=parse_config(STATED))
    template = capped["spec"]["template"]["metadata"]["annotations"]
    source = Source(failures=1)
    first = job_pod(template)
    source.fail(first, NOW - 10)
    verdict, out = admit(job_pod(template), source)
    assert verdict.allowed, verdict.message
    assert gates.not_before(out) == format_time(NOW - 10 + 240)


def test_growth_past_the_timeout_is_capped_too():
    annotations = {P + "retry-delay": "1m", P + "retry-delay-factor": "3", P + "backoff-limit": "4"}
    verdict, out = admit(queued(job(annotations)), config=parse_config(STATED))
    assert "retry-policy: retry-delay capped at 4m (a retry would wait 27m)" in (
        " ".join(verdict.warnings)
    )
    assert out["spec"]["template"]["metadata"]["annotations"] == {
        P + "retry-delay": "1m",
        P + "retry-delay-factor": "3",
        P + "retry-delay-max": "4m",
    }


def test_deny_names_the_annotation_its_value_and_what_would_be_accepted():
    config = parse_config(DENY)
    verdict = validate(queued(job(TEN_MINUTES)), config)
    assert not verdict.allowed
    assert verdict.message == (
        "retry-policy: annotation retry-policy.dev/retry-delay: 10m is too long for a workload "
        "queued by Kueue (kueue.x-k8s.io/queue-name: team-a): past Kueue's waitForPodsReady "
        "recoveryTimeout 5m a workload whose retry is held back (PodsReady=False) is evicted "
        "and requeued whole, and a released pod needs 1m to start (kueue.startupAllowance); "
        "accepted: a retry-delay up to 4m"
    )
    grows = {P + "retry-delay": "1m", P + "retry-delay-factor": "3", P + "retry-delay-max": "9m"}
    verdict = validate(queued(job(grows)), config)
    assert (
        "annotation retry-policy.dev/retry-delay-max: 9m lets a retry wait 9m, which is too "
        "long for a workload queued by Kueue"
    ) in verdict.message
    assert "accepted: retry-delay-max 4m or less, so that no retry waits longer" in (
        verdict.message
    )
    assert mutate(queued(job({P + "retry-delay": "4m"})), config)[0].allowed


def test_deny_caps_an_admin_default_instead():
    """A default must never make a valid object fail: it is capped, with the warning."""
    config = parse_config("defaults: {retry-delay: 10m}\n" + DENY)
    verdict, out = mutate(queued(job()), config)
    assert verdict.allowed, verdict.message
    assert any(w.startswith("retry-policy: retry-delay capped at 4m") for w in verdict.warnings)
    assert out["spec"]["template"]["metadata"]["annotations"][P + "retry-delay"] == "4m"


def test_cronjob_jobs_are_queued_by_their_template_label_and_jobsets_by_their_own():
    # upstream: QueueNameForObject (pkg/controller/jobframework/utils.go) reads the label
    # of the object Kueue manages: the Job a CronJob makes (its jobTemplate's labels), a
    # JobSet; PodsReady (pkg/controller/jobs/jobset/jobset_controller.go) counts the
    # JobSet's ready replicated Jobs, so a held-back run leaves it not ready.
    config = parse_config(STATED)
    cron = cronjob(TEN_MINUTES)
    cron["spec"]["jobTemplate"].setdefault("metadata", {})["labels"] = {QUEUE_LABEL: "nightly"}
    verdict, out = mutate(cron, config)
    assert any("(kueue.x-k8s.io/queue-name: nightly)" in w for w in verdict.warnings)
    template = out["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"]
    assert template[P + "retry-delay"] == "4m"
    # A label on the CronJob itself queues nothing: Kueue queues the Jobs it makes.
    assert not notes(mutate(queued(cronjob(TEN_MINUTES)), config)[0])

    restarts = {P + "retry-delay": "10m", P + "backoff-limit": "2"}
    verdict, out = mutate(queued(jobset(restarts)), config)
    assert verdict.allowed, verdict.message
    # Said once for the JobSet, though each replicated Job is checked (and capped).
    assert sum("retry-delay capped at 4m" in w for w in verdict.warnings) == 1
    assert len(notes(mutate(queued(jobset(restarts)))[0])) == 1
    for child in out["spec"]["replicatedJobs"]:
        annotations = child["template"]["spec"]["template"]["metadata"]["annotations"]
        assert annotations[P + "retry-delay-max"] == "4m"


def test_explain_and_dry_run_show_the_cap(tmp_path):
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: train\n  namespace: ml\n"
        f"  labels: {{{QUEUE_LABEL}: team-a}}\n"
        "  annotations: {retry-policy.dev/retry-delay: 2m, retry-policy.dev/retry-delay-factor:"
        " '2', retry-policy.dev/backoff-limit: '3'}\n"
        "spec:\n  template:\n    spec:\n      restartPolicy: Never\n"
        "      containers: [{name: main, image: busybox:1.36}]\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text(STATED + "\n")
    code, out, err = run(["explain", "-f", str(manifest), "--config", str(config), "-o", "json"])
    assert code == 0, err
    (item,) = json.loads(out)["items"]
    waits = [row["waits"] for row in item["plan"]["rows"]]
    assert waits == ["-", "2m", "4m", "4m"]  # 2m, 4m, then 8m capped at 4m
    assert item["changes"][0].startswith("retry-delay capped at 4m (a retry would wait 8m)")
    code, out, err = run(["dry-run", "-f", str(manifest), "--config", str(config)])
    assert code == 0
    assert "retry-policy.dev/retry-delay-max: 4m" in out
    assert "Change: retry-policy: retry-delay capped at 4m (a retry would wait 8m)" in err + out


# --- TrainJob: queued by Kueue, its JobSet not ------------------------------------------------


def test_a_trainjob_is_warned_and_denied_but_not_capped():
    from testkit.trainer import trainjob

    verdict, _ = mutate(queued(trainjob(TEN_MINUTES)), parse_config(STATED))
    assert verdict.allowed, verdict.message
    assert any(
        "a retry may wait 10m (retry-delay): past Kueue's waitForPodsReady recoveryTimeout 5m" in w
        and "not capped here: the JobSet its trainer makes carries your annotations" in w
        for w in verdict.warnings
    ), verdict.warnings
    verdict = validate(queued(trainjob(TEN_MINUTES)), parse_config(DENY))
    assert not verdict.allowed
    assert "annotation retry-policy.dev/retry-delay: 10m is too long for a workload" in (
        verdict.message
    )


# --- the real server ---------------------------------------------------------------------------


def test_the_server_tells_the_client_the_cap(tmp_path):
    """The warning reaches the client in the AdmissionReview response, as served."""
    config = tmp_path / "config.yaml"
    config.write_text(STATED + "\n")
    server = start(tmp_path / "certs", "--config", str(config))
    try:
        obj = queued(job(TEN_MINUTES))
        answer = server.review("/mutate", review(obj))
        response = answer["response"]
        assert response["allowed"]
        # A change: kubectl is shown it in the one line of changes (explain says each).
        assert " changes made: " in response["warnings"][0]
        mutated = apply(obj, decode_patch(answer))
        template = mutated["spec"]["template"]["metadata"]["annotations"]
        assert template[P + "retry-delay-max"] == "4m"
        # The validating webhook runs the same engine: the capped Job is allowed as is.
        assert server.review("/validate", review(mutated))["response"]["allowed"]
    finally:
        stop(server)


def test_the_engine_and_the_view_agree_on_the_queue_label():
    """The queue label is part of what the policy reads (the view keeps it), so a memo
    never answers a queued Job with an unqueued one's verdict."""
    config = parse_config(STATED)
    plain = job(TEN_MINUTES)
    first = engine.mutate(admission.decode(json.dumps(review(plain))), config, None)
    second = engine.mutate(
        admission.decode(json.dumps(review(queued(job(TEN_MINUTES))))), config, None
    )
    assert not notes(first) and notes(second)
