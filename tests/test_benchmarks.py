"""The benchmarks measure what their report says they measure.

Each stream is named for the path it exercises (the verdict memo answering, or the full
policy run for every object): if a change to the view or the memo moved a stream to the
other path, the report would compare the wrong things. No timing here: the figures live in
the benchmark output.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import orjson
import pytest

from benchmarks import https, lower_bound, scale
from benchmarks.cases import streams
from benchmarks.https import fixed_rate_report, ratios
from benchmarks.instructions import _totals
from benchmarks.report import markdown
from testkit.servers import scaled, start_slot
from webhook.admission import engine
from webhook.admission import review as admission
from webhook.policy.config import Config
from webhook.tls import certs

COUNT = 40

#: stream -> (full policy runs expected over COUNT requests, whether its answers patch)
EXPECTED = {
    "job-plain": (0, False),  # nothing to do: no mutator applies, nothing remembered
    "job-annotated": (1, True),  # a pipeline's runs: one policy run, then remembered
    "job-annotated-distinct": (COUNT, True),  # a policy of its own each: the worst case
    "pod-last-attempt": (1, True),  # the pods of one Job
    "pod-last-attempt-new": (1, True),  # pods of different Jobs, attempt annotated
    "pod-last-attempt-distinct": (COUNT, True),  # the owning Job is in the view
}


@pytest.fixture(scope="module")
def bodies() -> dict[str, list[bytes]]:
    return streams(COUNT)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_stream_takes_the_path_it_is_named_for(
    name: str, bodies: dict[str, list[bytes]]
) -> None:
    runs, patches = EXPECTED[name]
    stream = bodies[name]
    assert len(set(stream)) == COUNT  # every body differs, as a cluster's objects do
    config = Config()
    engine.MEMO.clear()
    verdicts = [engine.mutate(admission.decode(body), config) for body in stream]
    assert engine.MEMO.misses == runs
    assert all(v.allowed for v in verdicts)
    assert all(bool(v.patch) is patches for v in verdicts)
    engine.MEMO.clear()


def test_ratio_of_two_servers_survives_a_machine_speed_both_meet() -> None:
    """Rounds alternate between the servers, and the machine's speed factor of a round is
    the same whichever server runs in it: the ratio is that of the servers' own speeds."""
    factors = [1.0, 0.35, 0.9, 0.8, 1.0, 0.35, 0.95, 0.85]  # one per round, in turn
    floor = {"rps_rounds": [4000 * f for f in factors], "cpu_us_rounds": [300 / f for f in factors]}
    ours = {"rps_rounds": [3000 * f for f in factors], "cpu_us_rounds": [400 / f for f in factors]}
    for side in (floor, ours):
        side["best_rps"] = max(side["rps_rounds"])
    r = ratios({"floor": floor, "webhook": ours}, "floor", "webhook")
    assert r["throughput"] == pytest.approx(0.75, abs=0.01)
    assert r["per_cpu"] == pytest.approx(0.75, abs=0.01)
    assert r["best_throughput"] == pytest.approx(0.75, abs=0.01)


def test_callgrind_totals_are_read_from_a_complete_dump_only(tmp_path: Path) -> None:
    dump = tmp_path / "cg.123.1"
    dump.write_text("version: 1\ncmd: python\nevents: Ir\nfn=(1) main\n0 5\nsummary: 1234567\n")
    assert _totals(dump) == 1234567
    partial = tmp_path / "cg.123.2"
    partial.write_text("version: 1\ncmd: python\nevents: Ir\nfn=(1) main\n")
    assert _totals(partial) is None
    assert _totals(tmp_path / "missing") is None


def test_fixed_rate_percentiles_leave_out_each_connections_handshake() -> None:
    """Every sender's first request (by when it was sent, whatever order hey writes its
    rows in) pays its TLS handshake: reported apart, never in p50/p99."""
    header = (
        "response-time,DNS+dialup,DNS,Request-write,Response-delay,Response-read,"
        "status-code,offset\n"
    )

    def sender(first_at: float, handshake_s: float, steady_s: float, n: int) -> str:
        rows = [f"{steady_s},0,0,0,0,0,200,{first_at + 0.01 * (i + 1)}\n" for i in range(n)]
        return header + "".join(rows) + f"{handshake_s},0.005,0,0,0,0,200,{first_at}\n"

    outputs = [sender(0.001 * i, 0.030, 0.001, 99) for i in range(10)]
    report = fixed_rate_report(outputs, seconds=2, rate=500)
    assert report["p99_ms"] == pytest.approx(1.0)  # 10 handshakes of 30 ms are 1% of 1,000
    assert report["handshake_ms"] == pytest.approx(30.0)
    assert report["achieved_rps"] == 500
    assert report["senders"] == 10
    assert report["errors"] == 0
    slow = fixed_rate_report([*outputs[:9], sender(0.0, 0.030, 0.050, 99)], seconds=2, rate=500)
    assert slow["p99_ms"] == pytest.approx(50.0)  # a slow sender's steady requests do count


def _scale_row(lookup: float, plain: float) -> dict:
    return {
        "extra_rss_mb": 1.0,
        "lookup_median_ns": lookup,
        "dict_median_ns": plain,
        "own_cost_ns": lookup - plain,
        "warm_median_ns": lookup,
    }


def test_attempt_cache_flatness_leaves_out_what_a_plain_dict_pays_too() -> None:
    """Slower lookups at 100k that a plain dict of the same keys shows too are the CPU's
    caches, not the attempt cache: flat. Its own cost growing is not."""
    memory_bound = {"10000": _scale_row(1000, 100), "100000": _scale_row(1300, 400)}
    assert scale.flat(memory_bound) == pytest.approx(1.0)
    growing = {"10000": _scale_row(1000, 100), "100000": _scale_row(2000, 100)}
    assert scale.flat(growing) == pytest.approx(1900 / 900)
    machine = {"date": "d", "cores": 2, "cpu": "c", "python": "3", "load_average_at_start": 0}
    for results, expected in ((memory_bound, "meets target"), (growing, "**misses target**")):
        table = markdown({"machine": machine, "compute": {}, "scale": results})
        row = next(line for line in table.splitlines() if "own cost | x" in line)
        assert row.endswith(f"| {expected} |")


def test_the_report_names_the_machines_speed_when_it_was_measured() -> None:
    """Absolute timings only compare between runs with the machine's speed beside them;
    reports archived before it was measured still render."""
    machine = {"date": "d", "cores": 2, "cpu": "c", "python": "3", "load_average_at_start": 0}
    assert "reference loop" not in markdown({"machine": machine, "compute": {}, "scale": {}})
    measured = machine | {"reference_loop_ms": 68.4}
    header = markdown({"machine": measured, "compute": {}, "scale": {}}).splitlines()[0]
    assert "a reference loop (a million Python additions) took 68.4 ms;" in header
    assert header.endswith("load generator on the same machine.")


def _decoded(answer: bytes) -> dict:
    """An answer with its patch decoded, to compare two answers as the API server reads them."""
    response = json.loads(answer)["response"]
    response["patch"] = json.loads(base64.b64decode(response["patch"]))
    return response


def test_the_lower_bound_gives_the_engines_answer_to_the_worst_case_jobs(
    bodies: dict[str, list[bytes]],
) -> None:
    """The bound counts code that gives our answer and does nothing else: if it answered
    anything else (fewer patch operations, a warning short), its count would bound less
    work than ours."""
    engine.MEMO.clear()
    config = Config()
    for body in bodies["job-annotated-distinct"]:
        request = admission.decode(body)
        ours = _decoded(admission.encode_bytes(request.uid, engine.mutate(request, config)))
        bound = _decoded(lower_bound.answer(orjson.loads(body)))
        assert bound == ours
        assert len(ours["patch"]) >= 4 and " changes made: " in ours["warnings"][0]
    engine.MEMO.clear()


@pytest.mark.parametrize("name", ["job-plain", "pod-last-attempt"])
def test_the_lower_bound_refuses_objects_it_does_not_cover(
    name: str, bodies: dict[str, list[bytes]]
) -> None:
    with pytest.raises(lower_bound.OtherShape):
        lower_bound.answer(orjson.loads(bodies[name][0]))


def _side(rps: float, cpu_us: float) -> dict:
    return {"rps_rounds": [rps], "cpu_us_rounds": [cpu_us], "best_rps": rps, "best_cpu_us": cpu_us}


def _rate(p99: float) -> dict:
    return {
        "p50_ms": 1.0,
        "p99_ms": p99,
        "errors": 0,
        "senders": 10,
        "offered_rps": 500,
        "achieved_rps": 499.0,
    }


def _case(webhook: tuple, gunicorn: tuple, floor: tuple, p99: tuple = (3.0, 4.0)) -> dict:
    sides = {"webhook": _side(*webhook), "gunicorn": _side(*gunicorn), "floor": _side(*floor)}
    return {
        "saturated": sides,
        "vs_gunicorn": ratios(sides, "gunicorn", "webhook"),
        "vs_floor": ratios(sides, "floor", "webhook"),
        "fixed_500rps": {"webhook": _rate(p99[0]), "gunicorn": _rate(p99[1]), "floor": _rate(1.0)},
    }


def _row(table: str, measure: str, case: str) -> str:
    return next(line for line in table.splitlines() if f"| {measure} | {case} |" in line)


def test_each_stream_is_held_to_the_issues_target_for_it() -> None:
    """A pipeline's Jobs: 1.5x the gunicorn floor in throughput and 1.6x in CPU a request
    (issue 46); the never-repeating worst cases: 0.85 of it, and the worst-case Job 1.1x in
    CPU a request; streams that repeat: 0.85 of the floor on our server; p99 at 500 req/s:
    no worse than the gunicorn floor's in the same run."""
    machine = {"date": "d", "cores": 2, "cpu": "c", "python": "3", "load_average_at_start": 0}
    calibration = {"throughput": 1.0, "best_throughput": 1.0, "per_cpu": 1.0}
    scaling = {"ratio": 2.0, "1_worker": 1.0, "2_worker": 2.0}
    cases = {
        # 1.6x the throughput, but only 1.55x the CPU: misses (both are required)
        "job-annotated": _case((8000, 140), (5000, 217), (9000, 120)),
        # 0.9x the throughput, 1.11x the CPU: meets both
        "job-annotated-distinct": _case((4500, 180), (5000, 200), (9000, 120)),
        "pod-last-attempt-distinct": _case((4000, 300), (5000, 200), (9000, 120)),
        "job-plain": _case((8000, 120), (5000, 200), (9000, 110), p99=(4.5, 4.0)),
    }
    https_results = {
        "calibration_floor_vs_floor": calibration,
        "cases": cases,
        "scaling": scaling,
    }
    table = markdown({"machine": machine, "compute": {}, "scale": {}, "https": https_results})
    assert _row(table, "HTTPS saturated, vs the gunicorn floor", "job-annotated").endswith(
        "| **misses target** |"
    )
    assert _row(table, "HTTPS saturated, vs the gunicorn floor", "job-annotated-distinct").endswith(
        "| meets target |"
    )  # 0.90, per CPU 1.11
    cases["job-annotated"] = _case((8000, 135), (5000, 217), (9000, 120))  # per CPU 1.61
    cases["job-annotated-distinct"] = _case((4500, 200), (5000, 200), (9000, 120))  # 1.0
    table = markdown({"machine": machine, "compute": {}, "scale": {}, "https": https_results})
    assert _row(table, "HTTPS saturated, vs the gunicorn floor", "job-annotated").endswith(
        "| meets target |"
    )
    assert _row(table, "HTTPS saturated, vs the gunicorn floor", "job-annotated-distinct").endswith(
        "| **misses target** |"
    )
    assert _row(
        table, "HTTPS saturated, vs the gunicorn floor", "pod-last-attempt-distinct"
    ).endswith("| **misses target** |")  # 0.80
    assert _row(table, "HTTPS saturated, vs the floor on our server", "job-plain").endswith(
        "| meets target |"  # 0.89
    )
    assert _row(
        table, "HTTPS saturated, vs the floor on our server", "job-annotated-distinct"
    ).endswith("| (none) | |")  # the worst cases are held to the gunicorn floor only
    p99 = "HTTPS at 500 req/s (10 senders), p50 / p99"
    assert _row(table, p99, "job-plain").endswith("| **misses target** |")  # 4.5 > 4.0
    assert _row(table, p99, "job-annotated").endswith("| meets target |")


def test_the_floor_is_served_by_our_server_and_answers_allowed(tmp_path: Path, monkeypatch) -> None:
    """The floor the repeated streams are held to runs on the webhook's own server (the
    supervisor and granian workers), with an app that only parses and allows."""
    import ssl
    import urllib.request

    certs.generate(tmp_path, extra_dns=["localhost"])
    monkeypatch.setattr(https, "START_SECONDS", scaled(https.START_SECONDS))
    with start_slot():
        served = https.Served("floor", tmp_path, workers=1, threads=1)
    try:
        body = streams(1)["job-annotated"][0]
        request = urllib.request.Request(
            served.url, body, {"Content-Type": "application/json"}, method="POST"
        )
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        with urllib.request.urlopen(request, context=context, timeout=scaled(10)) as answer:
            assert answer.headers["server"] == "granian"
            response = json.loads(answer.read())["response"]
        assert response == {"uid": json.loads(body)["request"]["uid"], "allowed": True}
        workers = https._children(served.proc.pid)
        assert len(workers) == 1  # the supervisor's one worker: served as the webhook is
    finally:
        served.stop()


def test_the_failure_history_benchmark_measures_what_its_report_says() -> None:
    """One lineage per Job, fed as the pod watch feeds it; the report's figure per 100k
    Jobs is the bytes a Job times 100,000, against the target."""
    from benchmarks.report import history_rows

    result = scale.measure_history(50, 3, 2)
    assert result["lineages"] == 50 and result["held_mb"] >= 0
    row = {**result, "bytes_per_job": 1100, "held_mb": 0.1}
    (line,) = history_rows([row])
    assert "1100 bytes a Job: 105 MB per 100k Jobs" in line
    assert line.endswith("| **misses target** |")


def test_the_controller_cpu_benchmark_feeds_a_leader_that_works(tmp_path, monkeypatch) -> None:
    """The comparison with and without the controller means something only if the feeder's
    stream makes the leader work: one step of each kind against a leading server (the real
    ``serve`` against the HTTP test API) gets a disruption Event, the failure history of the
    OOM-killed pod on its Job, and the retry pod's gate released."""
    from benchmarks.controller_cpu import Feeder, Replica, controller_writes, worked
    from testkit.fakeapi import FakeAPI, write_kubeconfig
    from testkit.servers import eventually
    from webhook.cluster.record import Record
    from webhook.kube import gates

    api = FakeAPI(page_size=500).start()
    try:
        cert_dir = tmp_path / "certs"
        certs.generate(cert_dir, extra_dns=["localhost"])
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        feeder = Feeder(api, jobs_per_kind=1)
        feeder.gate_delay = 0.5

        def delayed_pod() -> dict:
            (delayed,) = feeder.runs["delayed"]
            with api.lock:
                (pod,) = [
                    p
                    for p in api.objects["pods"].values()
                    if p["metadata"]["labels"].get("job-name") == delayed.name
                ]
            return pod

        def released() -> bool:
            gated = delayed_pod()
            return gates.GATE not in [g["name"] for g in gated["spec"].get("schedulingGates") or []]

        monkeypatch.setattr(https, "START_SECONDS", scaled(https.START_SECONDS))
        with start_slot():
            replica = Replica(cert_dir, kubeconfig, tmp_path / "with.log", True, 1)
        try:
            replica.wait_leading(True, timeout=scaled(30))
            assert replica.controller_pid() in https._children(replica.proc.pid)
            first = len(api.requests)
            for kind, runs in feeder.runs.items():
                getattr(feeder, kind)(runs[0])
            # Each step's work, waited for whole: pod patches alone may be the failure
            # categories' conditions, before the gate is released.
            writes = eventually(
                lambda: worked(w := controller_writes(api, first)) and released() and w, 20
            )
        finally:
            replica.stop()
        assert writes["events_created"] >= 1
        oom_pod, disrupted_pod = feeder.made[0][1], feeder.made[1][1]
        with api.lock:
            oom = Record.of(api.objects["jobs"][feeder.runs["oom"][0].uid])
            disrupted = Record.of(api.objects["jobs"][feeder.runs["disrupted"][0].uid])
        assert oom is not None and oom.seen(oom_pod)  # the OOM kill, on its Job's record
        assert disrupted is not None and disrupted.disrupted(disrupted_pod)
        gated = delayed_pod()
        assert gates.GATE not in [g["name"] for g in gated["spec"].get("schedulingGates") or []]
        assert gates.GATED_LABEL not in gated["metadata"]["labels"]
    finally:
        api.stop()


def test_the_controller_cpu_row_misses_when_the_controller_idled_a_round() -> None:
    """Ratios within 1.05 prove nothing for a round in which the leader wrote nothing."""
    from benchmarks.controller_cpu import summary
    from benchmarks.report import controller_cpu_rows

    def window(order: int, cpu: float, writes: dict) -> dict:
        return {
            "order": order,
            "admission_cpu_us": cpu,
            "p50_ms": 1.0,
            "p99_ms": 3.0,
            "admission_cores": 0.4,
            "controller_cores": 0.05,
            "controller_cpu_ms_per_pod": 4.0,
            "cluster_cores": 0.1,
            "errors": 0,
            "achieved_rps": 500.0,
            "pod_steps": 120,
            "controller_writes": writes,
        }

    busy = {"events_created": 40, "job_patches": 80, "pod_patches": 40}
    rounds = {
        "with": [window(0, 1010.0, busy), window(2, 1030.0, {})],
        "without": [window(1, 1000.0, {}), window(3, 1000.0, {})],
    }
    result = {
        "settings": {
            "rounds": 2,
            "seconds": 10,
            "offered_rps": 500,
            "pod_steps_per_second": 12.0,
            "case": "job-annotated",
            "annotated_jobs": 90,
        },
        **summary(rounds),
    }
    # Each window against the windows without the controller around it.
    assert result["with"]["paired"]["admission_cpu_us"] == pytest.approx(1.02)
    assert result["with"]["ratio"]["admission_cpu_us"] == pytest.approx(1.02)
    assert result["arms"]["with"]["rounds_it_worked"] == 1
    ratio_row, own_row = controller_cpu_rows(result)
    assert ratio_row.endswith("| **misses target** |")
    assert "at work in 1 of 2 rounds" in own_row
    rounds["with"][1]["controller_writes"] = busy
    ratio_row, _ = controller_cpu_rows({**result, **summary(rounds)})
    assert ratio_row.endswith("| meets target |")


def test_a_leader_counts_as_leading_only_with_every_watch_of_its_controller_open(tmp_path):
    """``Leader.leading`` gates each scale benchmark's start: with a watch still listing,
    what the benchmark does meanwhile is lost to it and the run measures nothing."""
    from benchmarks.leader import JOB_WATCHES, POD_WATCHES, Leader
    from testkit.fakeapi import FakeAPI
    from testkit.servers import eventually

    api = FakeAPI(page_size=500).start()
    try:
        with Leader.start(api, tmp_path, thread=True) as leader:
            watches = [w for r in leader._manager.reconcilers for w in getattr(r, "watches", [])]
            eventually(lambda: watches and all(w.synced.is_set() for w in watches), 30)
            eventually(lambda: api.watcher_count("pods") >= POD_WATCHES, 30)
            assert (api.watcher_count("pods"), api.watcher_count("jobs")) == (
                POD_WATCHES,
                JOB_WATCHES,
            )
    finally:
        api.stop()
