"""Admission's capacity: the reviews a second one replica answers with p99 at most 10 ms,
``python -m benchmarks.capacity``.

The real server as the chart deploys it (``retry-webhook serve``: 2 granian workers of 8
threads under our supervisor, TLS, a log line per decision, metrics on: started by
``benchmarks.https.Served``), one replica on this 2-core machine (the chart gives each
worker a core: ``resources.limits.cpu: "2"``). ``wrk`` (``benchmarks.https.wrk``, which
posts a stream of distinct AdmissionReviews, ``benchmarks.cases``) offers more and more
load, step by step: 1, 2, 4, ... kept-alive connections, each step ``TRIALS`` runs of
``seconds``, the run of median p99 standing for it (a single stall of this shared machine
would otherwise decide a step). The capacity is the highest throughput of a step whose p99
stayed at most ``P99_MS``; the
steps past it say how the server degrades. ``wrk`` runs on the same 2 cores, so the
server has less than a whole machine: the figure is a floor.

Streams (``benchmarks.cases``): ``job-annotated`` (a pipeline's Jobs: one policy run,
then remembered verdicts) and ``job-annotated-distinct`` (every Job a policy of its own:
every review a full policy run, the worst case).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from benchmarks import https
from benchmarks.cases import streams
from webhook.tls import certs

P99_MS = 10.0
CONNECTIONS = (1, 2, 4, 8, 16, 32, 64)
#: Trials of each step; the one of median p99 stands for it.
TRIALS = 3
CASES = ("job-annotated", "job-annotated-distinct")


def steps(
    url: str, body: Path, seconds: int, connections: tuple[int, ...], trials: int = TRIALS
) -> list[dict]:
    """``wrk`` at each number of connections in turn, ``trials`` times each: the step is the
    trial of median p99 (one stall of a shared machine does not decide it), until that p99
    is five times the bound (no later step would be within it)."""
    found = []
    for count in connections:
        tried = [https.wrk(url, body, seconds, count) for _ in range(trials)]
        tried.sort(key=lambda r: r["p99_ms"] if r["p99_ms"] is not None else float("inf"))
        result = tried[len(tried) // 2]
        found.append({"connections": count, **result, "trial_p99_ms": [r["p99_ms"] for r in tried]})
        if (result["p99_ms"] or 0) > 5 * P99_MS:
            break
    return found


def capacity(found: list[dict]) -> dict:
    """The step of highest throughput whose p99 was within the bound (``None``: none)."""
    within = [s for s in found if s["p99_ms"] is not None and s["p99_ms"] <= P99_MS]
    best = max(within, key=lambda s: s["rps"], default=None)
    return {
        "reviews_per_s": best["rps"] if best else 0.0,
        "at_connections": best["connections"] if best else None,
        "p99_ms": best["p99_ms"] if best else None,
        "p50_ms": best["p50_ms"] if best else None,
    }


def run(
    seconds: int = 2,
    connections: tuple[int, ...] = CONNECTIONS,
    workers: int = 2,
    trials: int = TRIALS,
) -> dict:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install wrk")
    cases = streams()
    results: dict = {
        "p99_bound_ms": P99_MS,
        "seconds": seconds,
        "trials": trials,
        "workers": workers,
        "cases": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        cert_dir = Path(tmp) / "certs"
        certs.generate(cert_dir, extra_dns=["localhost"])
        server = https.Served("webhook", cert_dir, workers, 8)
        try:
            for name in CASES:
                body = Path(tmp) / f"{name}.jsonl"
                body.write_bytes(b"\n".join(cases[name]) + b"\n")
                https.wrk(server.url, body, 2, 8)  # warm-up: connections, caches, the memo
                found = steps(server.url, body, seconds, connections, trials)
                errors = sum(s["non_2xx"] for s in found)
                results["cases"][name] = {**capacity(found), "errors": errors, "steps": found}
        finally:
            server.stop()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=2)
    print(json.dumps(run(parser.parse_args().seconds), indent=2))
