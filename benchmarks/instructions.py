"""Instructions a request: the server's CPU work for one admission, counted, not timed.

``python -m benchmarks.instructions [--requests 200] [--cases job-plain,...]`` (needs
``valgrind``: ``apt-get install valgrind``). Writes
``benchmarks/results/instructions.json`` and prints a table.

The HTTPS throughput ratios (``benchmarks.https``) are timings on a shared 2-core VM whose
speed drifts between rounds; their calibration pair (the floor against itself) still lands
a few percent off 1.0. This is the noise-free cross-check: the webhook and the floor, each
served as in production (our supervisor and one granian worker here, TLS, so one process
serves every request), run under callgrind, and a serial keep-alive client posts each
case's stream. Per case: a warm-up (the first requests fill caches and the verdict memo,
as in a running server), five idle seconds counted, then ``--requests`` requests
counted. The count is every instruction the worker process ran in user space (TLS, HTTP
parsing, Flask, our code; not the kernel's work, much the same per request for both),
minus what it runs while idle (the maintenance loop) over the same wall time, which
callgrind's 50x slowdown would otherwise inflate. Instruction counts are not
time (cache misses and branch mispredictions are not counted), but they repeat exactly
from run to run, and a ratio of them moves only when the code does.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.cases import streams
from benchmarks.https import HTTPS_CASES, _free_port, server_command
from webhook.tls import certs

RESULTS = Path(__file__).parent / "results"
WARM_UP = 20


class Counted:
    """A server (the webhook or the floor) running under callgrind."""

    def __init__(self, which: str, cert_dir: Path, out_dir: Path):
        self.which = which
        self.port = _free_port()
        self.out_dir = out_dir
        out_dir.mkdir(parents=True)
        server = server_command(which, cert_dir, self.port, workers=1, threads=1)
        self.proc = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--trace-children=yes",
                f"--callgrind-out-file={out_dir}/cg.%p",
                *server,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.context = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
        self._wait_healthy()

    def _wait_healthy(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.which} exited under valgrind ({self.proc.returncode})")
            try:
                conn = http.client.HTTPSConnection(
                    "localhost", self.port, context=self.context, timeout=30
                )
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    conn.close()
                    return
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.which} not healthy under valgrind after {timeout} s")

    def post(self, bodies: list[bytes], count: int, start: int = 0) -> None:
        """``count`` bodies in turn over one kept-alive connection, as an API server does."""
        conn = http.client.HTTPSConnection(
            "localhost", self.port, context=self.context, timeout=600
        )
        try:
            for i in range(start, start + count):
                conn.request(
                    "POST", "/mutate", bodies[i % len(bodies)], {"Content-Type": "application/json"}
                )
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    raise RuntimeError(f"{self.which}: HTTP {response.status}")
        finally:
            conn.close()

    def _control(self, flag: str) -> None:
        # Without a pid, callgrind_control acts on every process running under callgrind
        # (this server's supervisor, worker and metrics process: nothing else runs here).
        subprocess.run(["callgrind_control", flag], capture_output=True, check=False, timeout=120)

    def count(self, work) -> tuple[dict[str, int], float]:
        """Instructions each process of the server ran while ``work()`` ran (by pid), and
        the seconds it took."""
        before = set(self.out_dir.iterdir())
        self._control("-z")
        started = time.monotonic()
        work()
        elapsed = time.monotonic() - started
        self._control("-d")
        deadline = time.monotonic() + 60
        dumps: set[Path] = set()
        while time.monotonic() < deadline:
            dumps = set(self.out_dir.iterdir()) - before
            if dumps and all(_totals(p) is not None for p in dumps):
                break
            time.sleep(0.5)
        # Dumps are named cg.<pid>.<sequence>.
        return {p.name.split(".")[1]: _totals(p) or 0 for p in dumps}, elapsed

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _totals(path: Path) -> int | None:
    """The instruction count in a callgrind dump (its ``summary:`` or ``totals:`` line)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    return None


def measure(requests: int, cases: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="rpw-instructions-") as tmp:
        cert_dir = Path(tmp) / "certs"
        certs.generate(cert_dir, extra_dns=["localhost"])
        bodies = streams(max(requests + WARM_UP, 300))
        per_server: dict[str, dict[str, dict]] = {}
        for which in ("floor", "webhook"):
            server = Counted(which, cert_dir, Path(tmp) / which)
            try:
                seen = {}
                for case in cases:
                    stream = bodies[case]
                    server.post(stream, WARM_UP)
                    # What each process runs with no requests (the worker's maintenance
                    # loop, the metrics process), to take off the busy count below.
                    idle, idle_s = server.count(lambda: time.sleep(5))
                    counted, seconds = server.count(
                        lambda s=stream, on=server: on.post(s, requests, start=WARM_UP)
                    )
                    # The worker is the process that did the work: by far the most.
                    pid = max(counted, key=lambda p: counted[p] - idle.get(p, 0) * seconds / idle_s)
                    background = idle.get(pid, 0) * seconds / idle_s
                    seen[case] = {
                        "instructions_per_request": round((counted[pid] - background) / requests),
                        "idle_share": round(background / counted[pid], 3),
                    }
                per_server[which] = seen
            finally:
                server.stop()
    result: dict = {"requests": requests, "warm_up": WARM_UP, "cases": {}}
    for case in cases:
        floor = per_server["floor"][case]["instructions_per_request"]
        ours = per_server["webhook"][case]["instructions_per_request"]
        result["cases"][case] = {
            "floor": per_server["floor"][case],
            "webhook": per_server["webhook"][case],
            # As the throughput ratios: 1.0 is "as cheap as the floor".
            "ratio": round(floor / ours, 3) if ours else None,
        }
    return result


def table(result: dict) -> str:
    lines = [
        "| case | webhook, instructions a request | floor | ratio (floor / webhook) |",
        "|---|---|---|---|",
    ]
    for case, r in result["cases"].items():
        lines.append(
            f"| {case} | {r['webhook']['instructions_per_request'] / 1e6:.3f} M "
            f"| {r['floor']['instructions_per_request'] / 1e6:.3f} M | {r['ratio']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--cases", default=",".join(HTTPS_CASES))
    args = parser.parse_args()
    unknown = set(args.cases.split(",")) - set(streams(1))
    if args.requests < 1 or unknown:
        parser.error(f"--requests must be at least 1; known cases: {', '.join(HTTPS_CASES)}")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("benchmarks.instructions needs valgrind: apt-get install valgrind")
    result = measure(args.requests, args.cases.split(","))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "instructions.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))


if __name__ == "__main__":
    main()
