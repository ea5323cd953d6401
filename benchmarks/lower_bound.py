"""A lower bound for the worst case: Python that gives the webhook's answer to a Job with
a policy of its own (the ``job-annotated-distinct`` stream) and does nothing else, counted
by callgrind.

``python -m benchmarks.lower_bound [--requests 1000]`` (needs ``valgrind``); writes
``benchmarks/results/lower_bound.json``.

Not the webhook, and not a way to run it: ``answer`` is straight-line code for exactly
the stream's shape (all five annotations a Job takes, the default config, no
podFailurePolicy already there), with no view, no memo, no copy and diff, no
collected problems, no decision log or metrics. It refuses any other shape, so it never
stands for work it does not do; ``tests/test_benchmarks.py`` holds it to the engine's
answer, after decoding. Its instructions a request are about what any Python
implementation pays for this answer on top of the floor's decode, and so about the best
ratio to the floor's server-side instructions (``benchmarks/results/instructions.json``)
that such an implementation could reach. docs/PERFORMANCE.md ("What was tried and learned")
quotes it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pybase64

P = "retry-policy.dev/"
_HEAD = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":'
_IGNORE = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
_ROOT = Path(__file__).resolve().parent.parent
RESULTS = _ROOT / "benchmarks" / "results"
_FLOOR = RESULTS / "instructions.json"


def _rule_id(rule: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(rule, option=orjson.OPT_SORT_KEYS)).hexdigest()[:8]


_IGNORE_ID = _rule_id(_IGNORE)


class OtherShape(ValueError):
    """The object is not one this bound covers."""


def _exit_codes(text: str) -> list[int]:
    codes = set()
    for part in text.split(","):
        code = int(part)
        if not 1 <= code <= 255:
            raise OtherShape(f"exit code {part}")
        codes.add(code)
    return sorted(codes)


def answer(review: dict[str, Any]) -> bytes:
    """The webhook's answer to one decoded review of the worst-case Job stream."""
    request = review["request"]
    obj = request["object"]
    if obj.get("kind") != "Job":
        raise OtherShape("not a Job")
    annotations = obj["metadata"].get("annotations", {})
    spec = obj["spec"]
    template = spec["template"]
    if (
        annotations.get(P + "fail-non-retriable") != "true"
        or annotations.get(P + "ignore-disruptions") != "true"
        or "podFailurePolicy" in spec
        or P + "error-propagation" in annotations  # denied on a Job
        or "annotations" in template.get("metadata", {})
        or not isinstance(template.get("metadata", {}).get("labels"), dict)
        or template["spec"].get("initContainers")
        or not isinstance(obj["metadata"].get("labels"), dict)
        or P + "managed" in obj["metadata"]["labels"]
    ):
        raise OtherShape("not the worst-case Job stream's shape")
    limit = int(annotations[P + "backoff-limit"])
    non_spot = int(annotations[P + "non-spot-attempts"])
    if not 0 <= limit <= 1000 or not 0 <= non_spot <= limit + 1:
        raise OtherShape("a policy the engine denies")
    retriable = _exit_codes(annotations[P + "retriable-exit-codes"])
    # One FailJob rule per application container (no init containers in this shape).
    names = [container["name"] for container in template["spec"]["containers"]]
    rules = [
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": name, "operator": "NotIn", "values": retriable},
        }
        for name in names
    ]
    # The record keeps which annotation wrote which rule (webhook.plan.record.rule_id).
    failing = ",".join(sorted({_rule_id(rule) for rule in rules}))
    applied = {
        "backoffLimit": limit,
        "failNonRetriable": retriable,
        "ignoreDisruptions": True,
        "nonSpotAttempts": non_spot,
        "origins": {"fail-non-retriable": failing, "ignore-disruptions": _IGNORE_ID},
        "v": 2,
    }
    recorded = {
        "op": "add",
        "path": "/metadata/annotations/retry-policy.dev~1applied",
        "value": orjson.dumps(applied).decode(),
    }
    # The label that finds every managed workload (webhook.kinds.audit), in the order of
    # the metadata's keys, as the diff walks them.
    label = {"op": "add", "path": "/metadata/labels/retry-policy.dev~1managed", "value": "enforce"}
    keys = list(obj["metadata"])
    first = keys.index("labels") < keys.index("annotations") if "annotations" in keys else False
    patch: list[dict[str, Any]] = [
        *([label, recorded] if first else [recorded, label]),
        # The label the controller and the chart select the pods of such a Job by
        # (webhook.plan.causes), beside the template's own.
        {
            "op": "add",
            "path": "/spec/template/metadata/labels/retry-policy.dev~1ignore-disruptions",
            "value": "true",
        },
        {
            "op": "add",
            "path": "/spec/template/metadata/annotations",
            "value": {
                P + "backoff-limit": str(limit),
                P + "non-spot-attempts": str(non_spot),
            },
        },
    ]
    old = spec.get("backoffLimit")
    # What kubectl is shown: the changes in one line (``engine.change_summary``), then the
    # warnings. The changes: the budget, the Ignore rule, the FailJob rules, what 137
    # assumes (``failureaware.OOM_SIGNAL``), podReplacementPolicy, the non-spot attempts.
    changes = 3 + (137 in retriable)
    if old != limit:
        patch.append({"op": "replace", "path": "/spec/backoffLimit", "value": limit})
        changes += 1
    if spec.get("podReplacementPolicy") != "Failed":
        patch.append({"op": "replace", "path": "/spec/podReplacementPolicy", "value": "Failed"})
        changes += 1
    if not all(name.isprintable() for name in names):
        raise OtherShape("a warning the API server would refuse")
    warnings = [
        f"retry-policy: {changes} change{'s' if changes != 1 else ''} made: retry-webhook "
        "explain -f <manifest> shows each and the retry plan (CLI in the webhook's image)"
    ]
    if spec.get("activeDeadlineSeconds") is None:
        warnings.append(
            "retry-policy: set spec.activeDeadlineSeconds: ignored disruptions retry with no cap"
        )
    patch.append(
        {"op": "add", "path": "/spec/podFailurePolicy", "value": {"rules": [_IGNORE, *rules]}}
    )
    response = {
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": pybase64.b64encode(orjson.dumps(patch)).decode(),
        "warnings": warnings,
    }
    return _HEAD + orjson.dumps(request["uid"]) + b"," + orjson.dumps(response)[1:] + b"}"


def _work(requests: int, bodies_file: str) -> None:
    """The counted process: decode every body (the floor's work, counted in both runs),
    then answer ``requests`` of them."""
    bodies = Path(bodies_file).read_bytes().splitlines()
    reviews = [orjson.loads(body) for body in bodies]
    for review in reviews[:requests]:
        answer(review)


def _count(requests: int, bodies_file: Path) -> int:
    """Every instruction of one ``_work`` process under callgrind."""
    from benchmarks.instructions import _totals

    with tempfile.TemporaryDirectory(prefix="rpw-bound-") as tmp:
        out = Path(tmp) / "cg.out"
        run = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-m",
                "benchmarks.lower_bound",
                "--work",
                str(requests),
                str(bodies_file),
            ],
            cwd=_ROOT,
            capture_output=True,
            text=True,
        )
        total = _totals(out) if run.returncode == 0 else None
    if total is None:
        sys.exit(f"callgrind run failed (exit {run.returncode}): {run.stderr[-2000:]}")
    return total


def measure(requests: int) -> dict[str, Any]:
    """Instructions a request of ``answer``: a run with every body decoded and none
    answered, taken from one that answers ``requests`` of them."""
    from benchmarks.cases import streams
    from benchmarks.report import TARGETS

    with tempfile.TemporaryDirectory(prefix="rpw-bound-") as tmp:
        bodies_file = Path(tmp) / "bodies"
        bodies_file.write_bytes(b"\n".join(streams(requests)["job-annotated-distinct"]))
        idle = _count(0, bodies_file)
        busy = _count(requests, bodies_file)
    bound = round((busy - idle) / requests)
    result: dict[str, Any] = {"requests": requests, "instructions_per_request": bound}
    if _FLOOR.exists():
        counted = json.loads(_FLOOR.read_text())["cases"]["job-annotated-distinct"]
        floor = counted["floor"]["instructions_per_request"]
        ours = counted["webhook"]["instructions_per_request"]
        result.update(
            floor=floor,
            webhook_over_floor=ours - floor,
            best_ratio=round(floor / (floor + bound), 3),
            # What our work over the floor may cost for the throughput target.
            budget_for_target=round(floor / TARGETS["https_throughput_ratio"] - floor),
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--work", nargs=2, metavar=("REQUESTS", "BODIES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.requests < 1:
        parser.error("--requests must be at least 1")
    if args.work:
        _work(int(args.work[0]), args.work[1])
        return
    if shutil.which("valgrind") is None:
        sys.exit("benchmarks.lower_bound needs valgrind: apt-get install valgrind")
    result = json.dumps(measure(args.requests), indent=2) + "\n"
    (RESULTS / "lower_bound.json").write_text(result)
    print(result, end="")


if __name__ == "__main__":
    main()
