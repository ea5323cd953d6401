"""The published scale envelope (issue 46, docs/SCALE.md): ``make bench-scale``.

``python -m benchmarks.envelope`` runs each line's benchmark once, writes
``benchmarks/results/scale.{json,md}`` and checks every measured value against its
threshold in ``benchmarks/envelope.yaml``: the exit status is 1 when one is outside (or
the file has no threshold for it). ``--runs 5 --write`` runs each benchmark five times and
writes ``envelope.yaml`` anew: each threshold the mean of the runs plus 20% (a bound on
a cost: writes, seconds, MB), or minus 20% (a floor on what is delivered: reviews a
second, the share of conditions that landed), the way Kueue publishes its performance
ranges. ``--only NAME`` runs one benchmark (``admission``, ``failures``...).

Each benchmark runs at the size its line names (``CONFIG``; said in the results:
``scale``). The
controller's lines play the cluster (``testkit.fakeapi``: the test API; the Job
controller, the kubelet and PodGC played, ``testkit.jobsim``, ``benchmarks.played``)
around the real controller process; where the API is paced (``testkit.pacing``: every
answer ``latency`` late, at most ``rate`` a second) the results say so (``api``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from benchmarks.report import RESULTS, machine

ENVELOPE = Path(__file__).parent / "envelope.yaml"
#: Mean + 20% (a cost), mean - 20% (a delivery).
MARGIN = 0.20
PLAYED = "test API (testkit.fakeapi) and a played Job controller, kubelet and PodGC"


@dataclass(frozen=True)
class Metric:
    """One measured value of an envelope line."""

    bench: str
    line: str  # the words
    unit: str
    direction: str  # "at_most": a cost; "at_least": a delivery
    target: float | None  # the bound, where it names one


METRICS = {
    "admission_reviews_per_s": Metric(
        "admission",
        "admission: reviews/s per 2-core replica at p99 <= 10 ms (a pipeline's Jobs)",
        "reviews/s",
        "at_least",
        None,
    ),
    "admission_reviews_per_s_distinct": Metric(
        "admission",
        "admission: reviews/s per 2-core replica at p99 <= 10 ms (every Job a new policy)",
        "reviews/s",
        "at_least",
        None,
    ),
    "writes_per_failed_pod": Metric(
        "failures", "at most 3 API writes per failed pod, amortised", "writes", "at_most", 3.0
    ),
    "landed_share_100": Metric(
        "landing",
        "our pod conditions landing before the Job controller judges the pod, 100 pods",
        "share",
        "at_least",
        0.99,
    ),
    "landed_share_1000": Metric(
        "landing",
        "our pod conditions landing before the Job controller judges the pod, 1,000 pods",
        "share",
        "at_least",
        0.99,
    ),
    "landed_share_1000_qps500": Metric(
        "landing",
        "the same, 1,000 pods, with the limits JobSet runs with (500 a second, burst 500)",
        "share",
        "at_least",
        0.99,
    ),
    # The bound: the child Jobs (10 here) plus a small constant (2).
    "writes_per_disruption_10k_jobset": Metric(
        "fanout", "writes per disruption in a 10,000-pod JobSet", "writes", "at_most", 12.0
    ),
    "backlog_drained_after_last_loss_s": Metric(
        "backlog",
        "the backlog after nodes are lost, drained (seconds after the last loss)",
        "s",
        "at_most",
        180.0,
    ),
    "controller_rss_mb": Metric(
        "footprint",
        "controller memory at 100k workloads plus 10k watched pods",
        "MB RSS",
        "at_most",
        250.0,
    ),
    # The same bound once every cache has listed again (every watch answered 410 Gone).
    "controller_relist_peak_mb": Metric(
        "footprint",
        "controller memory at its peak when every cache lists again, same scale",
        "MB RSS",
        "at_most",
        250.0,
    ),
}

#: What each benchmark runs with under ``make bench-scale`` and ``--runs``.
CONFIG: dict[str, dict] = {
    "admission": {"seconds": 2, "connections": (1, 2, 4, 8, 16, 32), "trials": 3},
    "failures": {},
    # At the chart's limits; then 1,000 pods at ``raised`` (controller.kubeAPIQPS and
    # kubeAPIBurst as JobSet sets its own: docs/OPERATIONS.md, sizing).
    "landing": {"sizes": (100, 1000), "raised": {"qps": 500, "burst": 500, "size": 1000}},
    "fanout": {"pods": 10_000},
    # The zone: 1,000 nodes of 8 pods (8,000 pods of 1,000 Jobs) lost in 60 s.
    "backlog": {"jobs": 1000, "nodes": 1000, "seconds": 60.0},
    "footprint": {"jobs": 100_000, "pods": 10_000},
}


def _admission(config: dict) -> dict:
    from benchmarks import capacity

    found = capacity.run(config["seconds"], tuple(config["connections"]), trials=config["trials"])
    cases = found["cases"]
    return {
        "values": {
            "admission_reviews_per_s": cases["job-annotated"]["reviews_per_s"],
            "admission_reviews_per_s_distinct": cases["job-annotated-distinct"]["reviews_per_s"],
        },
        "simulated": None,
        "scale": "one replica (2 granian workers) and wrk on the same 2 cores",
        "details": found,
    }


def _failures(config: dict) -> dict:
    from benchmarks import failures

    (found,) = failures.run()
    return {
        "values": {"writes_per_failed_pod": found["writes_per_failed_pod"]},
        "simulated": f"{PLAYED}; the API unpaced",
        "scale": f"{found['failed_pods']} failed pods of 60 Jobs, 10 a second",
        "details": found,
    }


def _landing(config: dict) -> dict:
    from benchmarks import landing

    found = landing.run(tuple(config["sizes"]))
    values = {f"landed_share_{r['pods']}": r["landed_share"] for r in found}
    raised = config.get("raised")
    if raised:
        (at,) = landing.run((raised["size"],), raised["qps"], raised["burst"])
        values[f"landed_share_{raised['size']}_qps{raised['qps']}"] = at["landed_share"]
        found = [*found, at]
    return {
        "values": values,
        "simulated": f"{PLAYED}; the API unpaced",
        "scale": "one Job of N pods all preempted at once; the chart's limits (50/100), "
        "and 1,000 pods at 500/500",
        "details": found,
    }


def _fanout(config: dict) -> dict:
    from benchmarks import fanout

    found = fanout.run(config["pods"])
    return {
        "values": {"writes_per_disruption_10k_jobset": found["writes_per_disruption"]},
        "simulated": f"{PLAYED}; the API unpaced",
        "scale": f"{found['pods']} pods, {found['child_jobs']} child Jobs, one preempted",
        "details": found,
    }


def _backlog(config: dict) -> dict:
    from benchmarks import backlog

    found = backlog.run(**config)
    drained = found["drained_after_last_loss_s"]
    api = found["api"]
    return {
        # not drained within the patience: no finite value, outside any threshold
        "values": {"backlog_drained_after_last_loss_s": drained},
        "simulated": (
            f"{PLAYED}; the API paced: {api['latency_s'] * 1000:g} ms an answer, "
            f"at most {api['rate_per_s']:g} a second"
        ),
        "scale": (
            f"{found['nodes']} nodes ({found['pods']} pods of {found['jobs']} Jobs) lost "
            f"over {found['lost_over_s']} s"
        ),
        "details": found,
    }


def _footprint(config: dict) -> dict:
    from benchmarks import footprint

    found = footprint.run(config["jobs"], config["pods"])
    return {
        "values": {
            "controller_rss_mb": found["rss_mb"],
            "controller_relist_peak_mb": found["relist_peak_rss_mb"],
        },
        "simulated": "the objects served by the test API (testkit.fakeapi), in pages of 500",
        "scale": f"{found['workloads']:,} annotated Jobs, {found['watched_pods']:,} watched pods",
        "details": found,
    }


BENCHES: dict[str, Callable[[dict], dict]] = {
    "admission": _admission,
    "failures": _failures,
    "landing": _landing,
    "fanout": _fanout,
    "backlog": _backlog,
    "footprint": _footprint,
}


def host() -> dict:
    """The machine: what ``nproc`` says, the CPU, the memory."""
    found = machine()
    with open("/proc/meminfo") as info:
        kb = next(int(line.split()[1]) for line in info if line.startswith("MemTotal"))
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": found["cpu"],
        "memory_gb": round(kb / 2**20, 1),
        "python": found["python"],
        "date": found["date"],
    }


def threshold(values: list[float], direction: str) -> float:
    """The envelope's bound from a line's runs: mean plus or minus ``MARGIN``."""
    mean = statistics.fmean(values)
    return round(mean * (1 + MARGIN if direction == "at_most" else 1 - MARGIN), 3)


def within(value: float | None, direction: str, bound: float) -> bool:
    if value is None:
        return False
    return value <= bound if direction == "at_most" else value >= bound


def measure(names: list[str], runs: int) -> dict:
    """Each benchmark of ``names`` ``runs`` times in turn: its results by name."""
    out = {}
    for name in names:
        config = CONFIG[name]
        rounds = []
        for index in range(runs):
            print(f"[{time.strftime('%H:%M:%S')}] {name} {index + 1}/{runs}", file=sys.stderr)
            try:
                rounds.append(BENCHES[name](config))
            except Exception as err:  # the other lines still run; this one has no value
                print(f"{name} failed: {err!r}", file=sys.stderr)
                rounds.append({"values": {}, "error": repr(err), "scale": "", "simulated": None})
        out[name] = {
            "config": {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()},
            "runs": rounds,
        }
    return out


def values_of(results: dict, metric: str) -> list[float | None]:
    bench = results.get(METRICS[metric].bench)
    return [r["values"].get(metric) for r in bench["runs"]] if bench else []


def envelope_doc(results: dict, where: dict) -> dict:
    """``envelope.yaml``'s content from ``--runs`` results."""
    lines = {}
    for metric, spec in METRICS.items():
        values = values_of(results, metric)
        if not values:
            continue
        bench = results[spec.bench]
        finite = [v for v in values if v is not None]
        mean = round(statistics.fmean(finite), 3) if len(finite) == len(values) else None
        meets = (
            None
            if spec.target is None or mean is None
            else within(mean, spec.direction, spec.target)
        )
        lines[metric] = {
            "line": spec.line,
            "unit": spec.unit,
            "direction": spec.direction,
            "threshold": threshold(finite, spec.direction) if mean is not None else None,
            "target": spec.target,
            "meets_target": meets,
            "mean": mean,
            "runs": values,
            "benchmark": f"benchmarks.{_module(spec.bench)}",
            "config": bench["config"],
            "scale": bench["runs"][0]["scale"],
            "simulated": bench["runs"][0]["simulated"] or False,
            "machine": where,
        }
    return {"margin": MARGIN, "lines": lines}


class _Plain(yaml.SafeDumper):
    """Every entry written out in full (no ``&id``/``*id`` for the shared machine)."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _module(bench: str) -> str:
    return "capacity" if bench == "admission" else bench


HEADER = """\
# The scale envelope (issue 46; docs/SCALE.md), written by
# `python -m benchmarks.envelope --runs {runs} --write`; `make bench-scale` checks a run
# against it (benchmarks/results/scale.md).
# threshold: the mean of the runs plus 20% for a cost (direction at_most: writes, seconds,
# MB), minus 20% for a delivery (at_least: reviews a second, shares); target: the issue's
# bound where it names one, and whether the mean meets it. Each line says the machine its
# runs came from, the size it ran at (scale, config), and what of the cluster was simulated
# (simulated: false, or how).
"""


def check(results: dict, envelope: dict) -> list[dict]:
    """Each measured value against its threshold."""
    rows = []
    lines = envelope.get("lines") or {}
    for metric, spec in METRICS.items():
        for value in values_of(results, metric):
            entry = lines.get(metric) or {}
            bound = entry.get("threshold")
            ok = bound is not None and within(value, spec.direction, bound)
            rows.append(
                {
                    "metric": metric,
                    "value": value,
                    "direction": spec.direction,
                    "threshold": bound,
                    "target": spec.target,
                    "within": ok,
                }
            )
    return rows


def markdown(results: dict, rows: list[dict], where: dict) -> str:
    out = [
        f"Run {where['date']} on {where['nproc']} cores ({where['cpu']}), "
        f"{where['memory_gb']} GB, Python {where['python']}.",
        "",
        "| metric | measured | threshold | issue's target | | scale | simulated |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        spec = METRICS[row["metric"]]
        run = results[spec.bench]["runs"][0]
        sign = "<=" if row["direction"] == "at_most" else ">="
        target = "" if row["target"] is None else f"{sign} {row['target']:g}"
        bound = "none" if row["threshold"] is None else f"{sign} {row['threshold']:g}"
        value = "not drained" if row["value"] is None else f"{row['value']:g} {spec.unit}"
        out.append(
            f"| {row['metric']} | {value} | {bound} | {target} | "
            f"{'within' if row['within'] else '**outside**'} | {run['scale']} | "
            f"{run['simulated'] or 'no'} |"
        )
    return "\n".join(out) + "\n"


def table(envelope: dict) -> str:
    """The envelope as docs/SCALE.md shows it (``--table``): a row a line."""
    out = [
        "| line | runs (mean) | published | issue's target | simulated |",
        "|---|---|---|---|---|",
    ]
    for metric, e in (envelope.get("lines") or {}).items():
        sign = "<=" if e["direction"] == "at_most" else ">="
        runs = ", ".join("-" if v is None else f"{v:g}" for v in e["runs"])
        mean = "-" if e["mean"] is None else f"{e['mean']:g}"
        bound = "-" if e["threshold"] is None else f"{sign} {e['threshold']:g} {e['unit']}"
        target = "" if e["target"] is None else f"{sign} {e['target']:g}"
        if e["meets_target"] is False:
            target += " (**missed**)"
        simulated = e["simulated"] or "no"
        out.append(
            f"| `{metric}`: {e['line']}; {e['scale']} | {runs} ({mean}) | {bound} | {target} "
            f"| {simulated} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--write", action="store_true", help="write envelope.yaml")
    parser.add_argument("--only", action="append", choices=list(BENCHES))
    parser.add_argument("--table", action="store_true", help="print envelope.yaml's table")
    args = parser.parse_args(argv)
    if args.table:
        print(table(yaml.safe_load(ENVELOPE.read_text())), end="")
        return 0
    names = args.only or list(BENCHES)
    where = host()
    results = measure(names, args.runs)
    if args.write:
        doc = envelope_doc(results, where)
        if args.only and ENVELOPE.exists():  # keep the lines not run this time
            doc["lines"] = {**yaml.safe_load(ENVELOPE.read_text())["lines"], **doc["lines"]}
            doc["lines"] = {m: doc["lines"][m] for m in METRICS if m in doc["lines"]}
        text = yaml.dump(doc, Dumper=_Plain, sort_keys=False, width=100)
        ENVELOPE.write_text(HEADER.format(runs=args.runs) + text)
    envelope = yaml.safe_load(ENVELOPE.read_text()) if ENVELOPE.exists() else {}
    rows = check(results, envelope)
    RESULTS.mkdir(exist_ok=True)
    summary = {"machine": where, "results": results, "check": rows}
    (RESULTS / "scale.json").write_text(json.dumps(summary, indent=2) + "\n")
    report = markdown(results, rows, where)
    (RESULTS / "scale.md").write_text(report)
    print(report)
    outside = [row["metric"] for row in rows if not row["within"]]
    if outside:
        print(f"outside the envelope: {', '.join(outside)}", file=sys.stderr)
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
