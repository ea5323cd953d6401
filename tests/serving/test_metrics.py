"""Metrics and logs of the real server (2 workers, attempt cache against the
HTTP Kubernetes API of testkit/fakeapi/), scraped from its metrics port after sending
real AdmissionReviews; and no secret of a request ever reaches the output."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.builders import P, job, job_owner, pod, review
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.servers import eventually, free_port, metric, scaled, start, stop
from webhook.admission.review import Verdict
from webhook.problems import Problem
from webhook.serving.app import denial_reasons

FULL = {
    P + "backoff-limit": "3",
    P + "fail-non-retriable": "true",
    P + "ignore-disruptions": "true",
}
CONFIG = """
guardRails:
  maxBackoffLimit: 5
namespaces:
  defaulted:
    defaults:
      ignore-disruptions: true
"""
HIST = "retry_webhook_admission_duration_seconds"


@pytest.fixture(scope="module")
def cluster():
    api = FakeAPI().start()
    yield api
    api.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory, cluster):
    tmp = tmp_path_factory.mktemp("metrics")
    (tmp / "config.yaml").write_text(CONFIG)
    write_kubeconfig(tmp / "kubeconfig", cluster.url)
    cluster.put("jobs", cached_job())
    env = {"KUBECONFIG": str(tmp / "kubeconfig")}
    srv = start(
        tmp / "certs",
        "--config",
        str(tmp / "config.yaml"),
        "--kube",
        "kubeconfig",
        workers=2,
        metrics_port=free_port(),
        env=env,
    )
    yield srv
    stop(srv)


def cached_job() -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "cached", "namespace": "ml", "uid": "uid-cached"},
        "spec": {},
        "status": {"failed": 3},
    }


def decision_pids(server, since: int = 0) -> set[int]:
    lines = server.logs()[since:]
    return {line["pid"] for line in lines if line.get("msg") == "admission decision"}


def settled(server) -> dict:
    """The metrics once every worker has written what it added up (they do once a
    second): two scrapes a flush interval apart that agree."""
    import time

    from testkit.servers import scaled

    previous = server.metrics()
    deadline = time.monotonic() + scaled(12)
    while time.monotonic() < deadline:
        time.sleep(1.2)  # a flush interval: no deadline, the least time to tell
        current = server.metrics()
        if current == previous:
            return current
        previous = current
    raise AssertionError("metrics still moving on an idle server")


def test_counters_and_histograms_move_with_the_right_labels(server):
    before = settled(server)  # the start-up requests that reached every worker included
    patched = 0
    # Enough Jobs that both workers answer some (their pids are in the decision logs):
    # the scrape must add up every worker's files.
    mark = len(server.logs())
    for _ in range(200):
        server.review("/mutate", review(job(FULL)))
        patched += 1
        if patched >= 6 and len(decision_pids(server, mark)) >= 2:
            break
    assert len(decision_pids(server, mark)) == 2
    server.review("/mutate", review(job(namespace="defaulted")))  # admin default only
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    server.review("/mutate", review(config_map))
    bad = server.review("/validate", review(job({P + "backoff-limit": "lots"})))
    assert bad["response"]["status"]["code"] == 422
    rail = server.review("/validate", review(job({P + "backoff-limit": "9"})))
    assert rail["response"]["status"]["code"] == 403
    status, _, _ = server.request("POST", "/mutate", "{nope", {"Content-Type": "application/json"})
    assert status == 400

    counted = [
        ("retry_webhook_mutations_total", {"kind": "Job", "annotation": name}, patched)
        for name in ("backoff-limit", "fail-non-retriable", "ignore-disruptions")
    ] + [
        ("retry_webhook_mutations_total", {"kind": "Job", "annotation": "none"}, 1),
        (
            "retry_webhook_denials_total",
            {"endpoint": "validate", "kind": "Job", "reason": "bad-value"},
            1,
        ),
        (
            "retry_webhook_denials_total",
            {"endpoint": "validate", "kind": "Job", "reason": "guard-rail"},
            1,
        ),
    ]

    patched_labels = {"endpoint": "mutate", "kind": "Job", "outcome": "patched"}
    counted += [
        (HIST + "_count", patched_labels, patched + 1),
        (HIST + "_count", {"endpoint": "mutate", "kind": "other", "outcome": "allowed"}, 1),
        (HIST + "_count", {"endpoint": "validate", "kind": "Job", "outcome": "denied"}, 2),
        (HIST + "_count", {"endpoint": "mutate", "kind": "unknown", "outcome": "bad_request"}, 1),
    ]

    def flushed():
        # Observations reach the shared files on each worker's next maintenance tick.
        samples = server.metrics()
        moves = [metric(samples, n, **kw) - metric(before, n, **kw) for n, kw, _ in counted]
        return samples if moves == [want for _, _, want in counted] else None

    after = eventually(flushed)

    def moved(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    patched_labels = {"endpoint": "mutate", "kind": "Job", "outcome": "patched"}
    assert moved(HIST + "_count", **patched_labels) == patched + 1
    assert moved(HIST + "_bucket", le="+Inf", **patched_labels) == patched + 1
    assert moved(HIST + "_sum", **patched_labels) > 0
    buckets = sorted(
        (float(dict(labels)["le"]), value)
        for (name, labels), value in after.items()
        if name == HIST + "_bucket" and dict(labels).items() >= patched_labels.items()
    )
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    assert moved(HIST + "_count", endpoint="mutate", kind="other", outcome="allowed") == 1
    assert moved(HIST + "_count", endpoint="validate", kind="Job", outcome="denied") == 2
    assert moved(HIST + "_count", endpoint="mutate", kind="unknown", outcome="bad_request") == 1
    for name in ("backoff-limit", "fail-non-retriable", "ignore-disruptions"):
        assert moved("retry_webhook_mutations_total", kind="Job", annotation=name) == patched
    assert moved("retry_webhook_mutations_total", kind="Job", annotation="none") == 1
    denials = "retry_webhook_denials_total"
    assert moved(denials, endpoint="validate", kind="Job", reason="bad-value") == 1
    assert moved(denials, endpoint="validate", kind="Job", reason="guard-rail") == 1


def test_attempt_cache_size_hits_and_misses(server, cluster):
    annotations = {P + "backoff-limit": "3", P + "non-spot-attempts": "1"}
    hit = pod(annotations, owner=job_owner("cached", "uid-cached"))
    answer = server.review("/mutate", review(hit))["response"]
    assert answer.get("patchType") == "JSONPatch"  # attempt 3 of 3: goes to non-spot nodes
    miss = pod(annotations, owner=job_owner("gone", str(uuid.uuid4())))
    answer = server.review("/mutate", review(miss))["response"]
    assert any("attempt number unknown" in w for w in answer["warnings"])

    def sampled():  # each worker samples its cache once a second
        samples = server.metrics()
        done = (
            metric(samples, "retry_webhook_attempt_cache_lookups_total", result="hit") >= 1
            and metric(samples, "retry_webhook_attempt_cache_lookups_total", result="miss") >= 1
            and metric(samples, "retry_webhook_attempt_cache_errors_total", type="fallback") >= 1
            and metric(samples, "retry_webhook_attempt_cache_synced") == 1  # every worker
        )
        return samples if done else None

    samples = eventually(sampled)
    assert metric(samples, "retry_webhook_attempt_cache_objects", resource="jobs") == 1
    body = json.loads(server.request("GET", "/readyz")[2])
    assert body["cache"] == "synced" and body["reasons"] == []


def test_certificate_and_config_gauges_are_set(server):
    samples = server.metrics()
    assert metric(samples, "retry_webhook_config_last_reload_successful") == 1
    expiry = metric(samples, "retry_webhook_certificate_expiry_timestamp_seconds")
    body = json.loads(server.request("GET", "/readyz")[2])
    from datetime import datetime

    assert expiry == datetime.fromisoformat(body["certificate"]["notAfter"]).timestamp()


MARKER = "s3cr3t-MARKER-7f1c"


def test_no_secret_reaches_logs_or_metrics(server):
    containers = [
        {
            "name": "main",
            "image": "busybox:1.36",
            "env": [{"name": "API_TOKEN", "value": MARKER}],
            "args": [f"--password={MARKER}"],
        }
    ]
    annotations = {**FULL, "team.example/token": MARKER}
    server.review("/mutate", review(job(annotations, containers=containers)))
    server.review("/validate", review(job(annotations, containers=containers)))
    # a bad value and an unknown key carrying the marker: denied, with the value in the
    # answer to the client, but not in the logs or as a label
    denied = review(job({P + "backoff-limit": MARKER, P + MARKER: "1"}))
    answer = server.review("/validate", denied)["response"]
    assert MARKER in answer["status"]["message"]
    server.review("/mutate", denied)
    owned = pod({P + "error-propagation": "earliest", "token": MARKER}, owner=job_owner())
    owned["spec"]["containers"][0]["env"] = [{"name": "PASSWORD", "value": MARKER}]
    server.review("/mutate", review(owned))
    server.request("POST", "/mutate", '{"x": "' + MARKER, {"Content-Type": "application/json"})
    scrape = server.metrics()
    assert not any(MARKER in str(key) for key in scrape)
    decisions = [line for line in server.logs() if line.get("msg") == "admission decision"]
    assert decisions and all("uid" in line and "duration_ms" in line for line in decisions)
    assert MARKER not in server.output()


def test_every_line_of_the_process_is_json(server):
    lines = server.logs()  # raises on a line that is not JSON
    loggers = {line["logger"] for line in lines}
    assert {"webhook.admission", "webhook.serving.server"} <= loggers
    assert any(name.startswith("_granian") for name in loggers)  # granian's own (Rust) lines
    started = [line for line in lines if line["msg"] == "worker started"]
    assert len({line["pid"] for line in started}) == 2  # each worker says so, as itself


def test_metrics_port_serves_only_metrics(server):
    import http.client

    # (its own admissions: the counters' families appear at their first count, whichever
    # test of the module ran before)
    assert server.review("/mutate", review(job(FULL)))["response"]["allowed"]
    rail = server.review("/validate", review(job({P + "backoff-limit": "9"})))
    assert rail["response"]["status"]["code"] == 403
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=scaled(10))
    conn.request("GET", "/secret-stuff")
    assert conn.getresponse().status == 404
    conn.close()
    wanted = {
        "retry_webhook_admission_duration_seconds",
        "retry_webhook_mutations",
        "retry_webhook_denials",
        "retry_webhook_certificate_expiry_timestamp_seconds",
        "retry_webhook_config_last_reload_successful",
    }

    def names() -> set[str]:
        conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=scaled(10))
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        return {f.name for f in text_string_to_metric_families(text)}

    # (a worker writes its counts at its next interval: wait for them, not for a time)
    eventually(lambda: wanted <= names())


def test_denial_reasons_are_problem_reasons():
    verdict = Verdict(allowed=False, reason="Invalid")
    assert list(denial_reasons(verdict)) == ["Invalid"]  # a denial without problems
    verdict.problems = [Problem("a", "x", "bad-value"), Problem("b", "y", "guard-rail")]
    assert list(denial_reasons(verdict)) == ["bad-value", "guard-rail"]


def test_metrics_port_taken_fails_the_start_clearly(tmp_path):
    import socket

    from testkit.servers import run_serve

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = run_serve(tmp_path / "certs", "--metrics-port", str(port))
    assert result.returncode == 2
    # What to do next, in one line: another port, or none (a second `make run` beside
    # another server on 9090).
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert f"cannot listen for metrics on 127.0.0.1:{port}" in line
    assert line.endswith("or --metrics-port 0 to serve without metrics")
    assert "Traceback" not in result.stderr


def test_metrics_dir_is_cleaned_at_start(tmp_path):
    stale = tmp_path / "prom"
    stale.mkdir()
    (stale / "counter_12345.db").write_bytes(b"stale")
    srv = start(
        tmp_path / "certs", metrics_port=free_port(), env={"PROMETHEUS_MULTIPROC_DIR": str(stale)}
    )
    try:
        assert not (stale / "counter_12345.db").exists()
        srv.review("/mutate", review(job(FULL)))
        patched = {"endpoint": "mutate", "kind": "Job", "outcome": "patched"}
        assert eventually(lambda: metric(srv.metrics(), HIST + "_count", **patched) == 1)
    finally:
        stop(srv)
    assert os.path.isdir(stale)  # a directory we were given is left in place


def test_a_dead_workers_live_gauges_are_dropped(tmp_path):
    import signal

    directory = tmp_path / "prom"
    srv = start(
        tmp_path / "certs",
        workers=2,
        metrics_port=free_port(),
        env={"PROMETHEUS_MULTIPROC_DIR": str(directory)},
    )
    try:

        def booted() -> list[int]:
            return [line["pid"] for line in srv.logs() if line["msg"] == "worker started"]

        victim = booted()[0]
        eventually(lambda: (directory / f"gauge_livemin_{victim}.db").exists())
        os.kill(victim, signal.SIGKILL)
        eventually(lambda: not (directory / f"gauge_livemin_{victim}.db").exists())
        eventually(lambda: len(booted()) == 3)  # the supervisor replaced it
        assert srv.review("/mutate", review(job(FULL)))["response"]["allowed"]
    finally:
        stop(srv)


def test_counts_of_the_last_interval_are_written_at_graceful_exit(tmp_path):
    """Counters are added up in memory between flushes: a worker that is stopped
    (SIGTERM) writes what it has not flushed yet before it exits."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    directory = tmp_path / "prom"
    srv = start(
        tmp_path / "certs",
        metrics_port=free_port(),
        env={"PROMETHEUS_MULTIPROC_DIR": str(directory)},
    )
    try:
        for _ in range(3):
            srv.review("/mutate", review(job(FULL)))
    finally:
        stop(srv)  # at once: well within the one-second flush interval
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    counted = {
        sample.labels["annotation"]: sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == "retry_webhook_mutations_total"
    }
    assert counted == {"backoff-limit": 3, "fail-non-retriable": 3, "ignore-disruptions": 3}


def test_batched_latencies_expose_exactly_what_one_observe_each_would():
    """Latencies are added up per worker and written in one go; the histogram a scrape
    sees must be the one prometheus_client's own ``observe`` would have built."""
    from prometheus_client import CollectorRegistry, Histogram

    from webhook.serving.metrics import LATENCY_BUCKETS, Metrics

    values = [0.0, 0.0004, 0.001, 0.0010001, 0.0025, 0.07, 3.0, 10.0, 11.0, 0.001]
    ours = Metrics()
    for value in values:
        ours.observe_admission("mutate", "Pod", "patched", value)
    ours.observe_admission("validate", "Job", "denied", 0.2)
    registry = CollectorRegistry()
    reference = Histogram(
        "retry_webhook_admission_duration_seconds",
        "reference",
        ["endpoint", "kind", "outcome"],
        buckets=LATENCY_BUCKETS,
        registry=registry,
    )
    for value in values:
        reference.labels("mutate", "Pod", "patched").observe(value)
    reference.labels("validate", "Job", "denied").observe(0.2)

    def samples(reg):
        return sorted(
            (s.name, tuple(sorted(s.labels.items())), s.value)
            for family in reg.collect()
            if family.name == "retry_webhook_admission_duration_seconds"
            for s in family.samples
            if not s.name.endswith("_created")
        )

    assert all(value == 0 for _, _, value in samples(ours.registry))  # not yet written
    ours.flush()
    assert samples(ours.registry) == samples(registry)
    ours.flush()  # nothing new: nothing added twice
    assert samples(ours.registry) == samples(registry)
