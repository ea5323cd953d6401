"""Compute only: the in-process time to answer one AdmissionReview end to end
(decode, policy, mutate, patch, encode), per case, median and p99."""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Callable

from benchmarks.cases import all_cases
from webhook import admission, engine
from webhook.config import Config


def handler(config: Config) -> Callable[[bytes], bytes]:
    def handle(body: bytes) -> bytes:
        request = admission.decode(body)
        verdict = engine.mutate(request, config)
        return admission.encode_bytes(request.uid, verdict)

    return handle


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, round(q * (len(ordered) - 1)))
    return ordered[index]


def measure(handle: Callable[[bytes], bytes], body: bytes, budget_s: float) -> dict[str, float]:
    for _ in range(20):  # warm-up
        handle(body)
    samples: list[float] = []
    gc.collect()
    deadline = time.perf_counter() + budget_s
    while time.perf_counter() < deadline or len(samples) < 50:
        started = time.perf_counter_ns()
        handle(body)
        samples.append((time.perf_counter_ns() - started) / 1000)
    return {
        "n": len(samples),
        "median_us": round(statistics.median(samples), 1),
        "p99_us": round(percentile(samples, 0.99), 1),
        "body_bytes": len(body),
    }


def run(budget_s: float = 2.0) -> dict[str, dict[str, float]]:
    handle = handler(Config())
    return {name: measure(handle, body, budget_s) for name, body in all_cases().items()}


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
