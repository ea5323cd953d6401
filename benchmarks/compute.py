"""Compute only: the in-process time to answer one AdmissionReview end to end
(decode, policy, mutate, patch, encode), per case, median and p99. Each case is a
stream of reviews (``benchmarks.cases.streams``): distinct objects where every request
needs the full policy run, the pods of one Job where the verdict memo answers repeats.

The machine's speed drifts (a shared VM), so every case is measured in interleaved rounds
together with its baseline, the floor: decoding the same review and encoding an
"allowed" answer (what any webhook must do). Drift hits both alike; the median of the
per-round medians and the ratio to the floor are what the report uses.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Callable

from benchmarks.cases import streams
from webhook.admission import engine, memo
from webhook.admission import review as admission
from webhook.admission.review import Verdict
from webhook.policy.config import Config


def handler(config: Config) -> Callable[[bytes], bytes]:
    def handle(body: bytes) -> bytes:
        request = admission.decode(body)
        verdict = engine.mutate(request, config)
        return admission.encode_bytes(request.uid, verdict)

    return handle


def floor(body: bytes) -> bytes:
    request = admission.decode(body)
    return admission.encode_bytes(request.uid, Verdict())


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, round(q * (len(ordered) - 1)))
    return ordered[index]


def sample(handle: Callable[[bytes], bytes], bodies: list[bytes], budget_s: float) -> list[float]:
    """Time ``handle`` on the stream's bodies in turn (a stream of distinct objects
    defeats the verdict memo; the pods of one Job are meant to hit it)."""
    for body in bodies[:10]:  # warm-up
        handle(body)
    samples: list[float] = []
    gc.collect()
    deadline = time.perf_counter() + budget_s
    index = 0
    while time.perf_counter() < deadline or len(samples) < 30:
        body = bodies[index % len(bodies)]
        index += 1
        started = time.perf_counter_ns()
        handle(body)
        samples.append((time.perf_counter_ns() - started) / 1000)
    return samples


#: Cases measured with the memo off (one body, repeated: the worst case is each repeat
#: computed in full).
MEMO_OFF = ("pod-1MiB",)


def run(budget_s: float = 3.0, rounds: int = 6) -> dict[str, dict[str, float]]:
    handle = handler(Config())
    results = {}
    per_round = budget_s / rounds
    for name, bodies in streams().items():
        engine.MEMO.clear()
        engine.MEMO.max_entries = 0 if name in MEMO_OFF else memo.MAX_ENTRIES
        ours: list[float] = []
        base: list[float] = []
        medians: list[float] = []
        ratios: list[float] = []
        for _ in range(rounds):
            a = sample(handle, bodies, per_round)
            b = sample(floor, bodies, per_round / 2)
            ours += a
            base += b
            medians.append(statistics.median(a))
            ratios.append(statistics.median(a) / statistics.median(b))
        results[name] = {
            "n": len(ours),
            "median_us": round(statistics.median(medians), 1),
            "p99_us": round(percentile(ours, 0.99), 1),
            "floor_median_us": round(statistics.median(base), 1),
            "vs_floor": round(statistics.median(ratios), 2),
            "body_bytes": len(bodies[0]),
            "distinct_bodies": len(bodies),
            "memo": engine.MEMO.stats() | {"off": name in MEMO_OFF},
        }
    engine.MEMO.max_entries = memo.MAX_ENTRIES
    return results


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
