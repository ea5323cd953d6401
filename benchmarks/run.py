"""One command for all benchmarks: ``python -m benchmarks.run [--quick] [--skip-https]``.

Writes ``benchmarks/results/latest.json`` and ``benchmarks/results/latest.md`` (the table
docs/PERFORMANCE.md quotes, ``benchmarks.report``), with the machine the run happened on and
the targets side by side. Both floors (``benchmarks.floor``: the allow-all app on our
server, and under gunicorn) are measured in the same run as the webhook, round after round;
the slow-client attack (``benchmarks.slowclients``) runs against the webhook and the
gunicorn floor.
"""

from __future__ import annotations

import argparse
import json

from benchmarks import compute, controller, controller_cpu, https, scale, slowclients
from benchmarks.report import RESULTS, machine, markdown


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    parser.add_argument("--skip-https", action="store_true")
    args = parser.parse_args()
    results: dict = {"machine": machine()}
    results["compute"] = compute.run(0.6 if args.quick else 6.0)
    if not args.skip_https:
        results["https"] = https.run(**({"seconds": 2, "rounds": 2} if args.quick else {}))
        results["slow_clients"] = slowclients.run()
    results["scale"] = scale.run()
    results["history"] = scale.run_history()
    results["controller_memory"] = controller.run()
    results["controller_cpu"] = controller_cpu.run(
        **({"rounds": 2, "seconds": 3} if args.quick else {})
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (RESULTS / "latest.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
