"""Soak: mixed admission load at a fixed rate for a long time, with the server's memory
and errors sampled as it goes. ``python -m benchmarks.soak [--minutes 10] [--rate 200]``

The mix is what a cluster sends: mostly Jobs without annotations, annotated Jobs, pods
on their last attempt, JobSets, invalid policies (denials) and a few malformed bodies
(400s). Writes ``benchmarks/results/soak.json`` and prints a summary: requests, errors
by kind, resident memory of master and workers at start and end, and growth per hour.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.cases import ANNOTATED, all_cases, job, review
from benchmarks.https import Served, _children
from webhook.tls import certs

RESULTS = Path(__file__).parent / "results"


def rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def mix() -> list[tuple[str, bytes, int]]:
    """(name, body, weight): the request mix and each request's expected HTTP status."""
    cases = all_cases()
    bad = dict(ANNOTATED)
    bad["retry-policy.dev/backoff-limit"] = "lots"
    entries = [
        ("job-plain", cases["job-plain"], 60),
        ("job-annotated", cases["job-annotated"], 15),
        ("pod-last-attempt", cases["pod-last-attempt"], 15),
        ("job-denied", review(job(bad)), 5),
        ("malformed", b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', 2),
    ]
    if "jobset-4" in cases:
        entries.append(("jobset-4", cases["jobset-4"], 3))
    return entries


def run(minutes: float, rate: int, workers: int = 2) -> dict:
    entries = mix()
    names = [e[0] for e in entries]
    weights = [e[2] for e in entries]
    bodies = {e[0]: e[1] for e in entries}
    with tempfile.TemporaryDirectory() as tmp:
        cert_dir = Path(tmp) / "certs"
        certs.generate(cert_dir, extra_dns=["localhost"])
        server = Served("webhook", cert_dir, workers, 8)
        context = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
        counts: dict[str, int] = {}
        errors: dict[str, int] = {}
        lock = threading.Lock()
        stop = threading.Event()
        samples: list[dict] = []

        def sample() -> None:
            pids = [server.proc.pid, *_children(server.proc.pid)]
            samples.append(
                {
                    "t": round(time.monotonic() - started, 1),
                    "rss_kib": {p: rss_kib(p) for p in pids},
                }
            )

        def client(share: float) -> None:
            """One kept-alive connection, as the API server's client pool keeps them."""
            rng = random.Random(os.getpid() ^ threading.get_ident())
            interval = 1.0 / share
            next_at = time.monotonic()
            conn = None
            while not stop.is_set():
                name = rng.choices(names, weights)[0]
                expected = 400 if name == "malformed" else 200
                try:
                    if conn is None:
                        conn = http.client.HTTPSConnection(
                            "localhost", server.port, context=context, timeout=10
                        )
                    conn.request(
                        "POST", "/mutate", bodies[name], {"Content-Type": "application/json"}
                    )
                    resp = conn.getresponse()
                    resp.read()
                    outcome = "ok" if resp.status == expected else f"http-{resp.status}"
                except (OSError, http.client.HTTPException) as err:
                    outcome = type(err).__name__
                    if conn is not None:
                        conn.close()
                    conn = None
                with lock:
                    counts[name] = counts.get(name, 0) + 1
                    if outcome != "ok":
                        errors[outcome] = errors.get(outcome, 0) + 1
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    stop.wait(delay)
                else:
                    next_at = time.monotonic()  # behind: do not burst to catch up

        started = time.monotonic()
        sample()
        threads = [threading.Thread(target=client, args=(rate / 8,), daemon=True) for _ in range(8)]
        for thread in threads:
            thread.start()
        deadline = started + minutes * 60
        while time.monotonic() < deadline:
            time.sleep(min(30.0, max(0.0, deadline - time.monotonic())))
            sample()
        stop.set()
        for thread in threads:
            thread.join(15)
        elapsed = time.monotonic() - started
        server.stop()

    total = sum(counts.values())
    return {
        "minutes": round(elapsed / 60, 2),
        "offered_rps": rate,
        "achieved_rps": round(total / elapsed, 1),
        "requests": total,
        "by_case": counts,
        "errors": errors,
        "error_count": sum(errors.values()),
        **memory(samples),
        "samples": samples,
    }


def memory(samples: list[dict], warm_up_s: float = 60.0) -> dict:
    """Resident memory at start and end, and growth after warm-up (imports, caches and
    buffers fill during the first seconds of load; a leak keeps growing after)."""
    first, last = samples[0]["rss_kib"], samples[-1]["rss_kib"]
    warm = next((s for s in samples if s["t"] >= warm_up_s), samples[0])
    # Compare the same processes (workers are long-lived; none should have restarted).
    common = [pid for pid in last if pid in first and pid in warm["rss_kib"]]
    growth_kib = sum(last[p] - warm["rss_kib"][p] for p in common)
    window_h = max(samples[-1]["t"] - warm["t"], 1.0) / 3600
    return {
        "rss_start_mib": round(sum(first.values()) / 1024, 1),
        "rss_after_warm_up_mib": round(sum(warm["rss_kib"].values()) / 1024, 1),
        "rss_end_mib": round(sum(last.values()) / 1024, 1),
        "rss_growth_after_warm_up_mib": round(growth_kib / 1024, 2),
        "rss_growth_after_warm_up_mib_per_hour": round(growth_kib / 1024 / window_h, 2),
        "processes_restarted": len(first) - len(common),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate", type=int, default=200)
    args = parser.parse_args()
    result = run(args.minutes, args.rate)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    sys.exit(1 if result["error_count"] else 0)


if __name__ == "__main__":
    main()
