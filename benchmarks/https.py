"""Over HTTPS: the real server (``retry-webhook serve``: gunicorn, TLS, production
settings) under load from real load generators, against the floor served the same way.

- saturated: ``wrk`` with keep-alive connections, throughput and latency percentiles;
- fixed rate: ``hey`` at 500 requests/s offered, p50 and p99 from every request's time;
- scaling: the same saturated run with one worker process and with two (the closest this
  2-core machine gets to "a second replica").

Request bodies are real AdmissionReviews (benchmarks/cases.py).
"""

from __future__ import annotations

import atexit
import csv
import io
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.cases import all_cases
from webhook import certs

LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open(os.getenv("BODY_FILE"), "rb")
wrk.body = f:read("*a")
f:close()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(port: int, ca: Path, proc: subprocess.Popen) -> None:
    context = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(
                f"https://localhost:{port}/healthz", context=context, timeout=2
            ):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server not healthy")


class Served:
    """A server process (the webhook or the floor) on a free port."""

    def __init__(self, which: str, cert_dir: Path, workers: int, threads: int):
        self.port = _free_port()
        if which == "webhook":
            cmd = [
                str(Path(sys.executable).parent / "retry-webhook"),
                "serve",
                "--cert-dir",
                str(cert_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--kube",
                "off",
                # Production settings: a log line per decision, metrics on.
                "--log-level",
                "info",
                "--metrics-port",
                str(_free_port()),
                "--workers",
                str(workers),
                "--threads",
                str(threads),
            ]
        else:
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.floor",
                "--cert-dir",
                str(cert_dir),
                "--port",
                str(self.port),
                "--workers",
                str(workers),
                "--threads",
                str(threads),
            ]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ}
        )
        _wait_healthy(self.port, cert_dir / "ca.crt", self.proc)

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}/mutate"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _children(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    ).stdout
    return [int(p) for p in out.split()]


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


_SCRIPT: list[str] = []


def _script() -> str:
    """The Lua script that makes wrk post the body: written once, removed at exit."""
    if not _SCRIPT:
        with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
            script.write(LUA)
        _SCRIPT.append(script.name)
        atexit.register(os.unlink, script.name)
    return _SCRIPT[0]


def _start_wrk(url: str, body_file: Path, seconds: int, connections: int) -> subprocess.Popen:
    """``wrk`` posting ``body_file`` over ``connections`` kept-alive connections."""
    command = ["wrk", "-t", "1", "-c", str(connections), "-d", f"{seconds}s", "--latency"]
    return subprocess.Popen(
        [*command, "-s", _script(), url],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "BODY_FILE": str(body_file)},
    )


def wrk(url: str, body_file: Path, seconds: int, connections: int) -> dict:
    run = _start_wrk(url, body_file, seconds, connections)
    out = run.communicate()[0]
    if run.returncode:
        raise RuntimeError(f"wrk failed: {out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    total = int(re.search(r"(\d+) requests in", out).group(1))
    latency = {p: _ms(v) for p, v in re.findall(r"^\s+(50|90|99)%\s+(\S+)", out, re.M)}
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": round(rps, 1),
        "requests": total,
        "p50_ms": latency.get("50"),
        "p90_ms": latency.get("90"),
        "p99_ms": latency.get("99"),
        "non_2xx": int(errors.group(1)) if errors else 0,
        "socket_errors": socket_errors.group(1) if socket_errors else "",
    }


def hey(url: str, body_file: Path, seconds: int, rate: int, workers: int = 10) -> dict:
    out = subprocess.run(
        [
            "hey",
            "-z",
            f"{seconds}s",
            "-c",
            str(workers),
            "-q",
            str(rate // workers),
            "-m",
            "POST",
            "-T",
            "application/json",
            "-D",
            str(body_file),
            "-o",
            "csv",
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    latencies = sorted(float(r["response-time"]) * 1000 for r in rows)
    ok = sum(1 for r in rows if r["status-code"] == "200")
    pick = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)  # noqa: E731
    return {
        "offered_rps": rate,
        "achieved_rps": round(len(rows) / seconds, 1),
        "p50_ms": pick(0.50),
        "p99_ms": pick(0.99),
        "errors": len(rows) - ok,
    }


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def head_to_head(a: Served, b: Served, body: Path, seconds: int, connections: int) -> float:
    """Load two servers at the same time; return b's completed requests over a's.

    On a shared virtual machine the capacity of the cores drifts by 2-4x over tens of
    seconds (solo runs of one build differ that much). Two servers loaded at once live
    through the same drift, so the ratio of what each completes is what the drift does
    not distort: both are saturated, and the one that needs less CPU per request
    completes more.
    """
    runs = [_start_wrk(server.url, body, seconds, connections) for server in (a, b)]
    outs = [run.communicate()[0] for run in runs]
    done = [int(re.search(r"(\d+) requests in", out).group(1)) for out in outs]
    return done[1] / max(done[0], 1)


def run(
    seconds: int = 10,
    workers: int = 2,
    threads: int = 8,
    connections: int = 16,
    rounds: int = 5,
) -> dict:
    for tool in ("wrk", "hey"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: apt-get install {tool}")
    cases = all_cases()
    settings = {
        "seconds": seconds,
        "workers": workers,
        "threads": threads,
        "connections": connections,
        "rounds": rounds,
    }
    results: dict = {"settings": settings, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        cert_dir = Path(tmp) / "certs"
        certs.generate(cert_dir, extra_dns=["localhost"])
        floor = Served("floor", cert_dir, workers, threads)
        webhook = Served("webhook", cert_dir, workers, threads)
        twin = Served("floor", cert_dir, workers, threads)
        try:
            calibration_body = Path(tmp) / "calibration.json"
            calibration_body.write_bytes(cases["job-plain"])
            calibration = [
                round(head_to_head(floor, twin, calibration_body, seconds, connections), 3)
                for _ in range(rounds)
            ]
            results["calibration_floor_vs_floor"] = {
                "rounds": calibration,
                "median": _median(calibration),
            }
            for name in ("job-plain", "job-annotated", "pod-last-attempt"):
                body = Path(tmp) / f"{name}.json"
                body.write_bytes(cases[name])
                entry: dict = {}
                for which, server in (("floor", floor), ("webhook", webhook)):
                    wrk(server.url, body, 2, connections)  # warm-up
                    entry[which] = {
                        "saturated": wrk(server.url, body, max(seconds // 2, 2), connections),
                        "fixed_500rps": hey(server.url, body, 10, 500),
                    }
                ratios = [
                    round(head_to_head(floor, webhook, body, seconds, connections), 3)
                    for _ in range(rounds)
                ]
                entry["head_to_head_rounds"] = ratios
                entry["throughput_ratio"] = _median(ratios)
                results["cases"][name] = entry
        finally:
            for server in (floor, webhook, twin):
                server.stop()
        body = Path(tmp) / "scale.json"
        body.write_bytes(cases["job-annotated"])
        one, two = Served("webhook", cert_dir, 1, threads), Served("webhook", cert_dir, 2, threads)
        try:
            scaling_runs: dict[str, list[float]] = {"1_worker": [], "2_worker": []}
            for _ in range(rounds):
                for label, server in (("1_worker", one), ("2_worker", two)):
                    scaling_runs[label].append(wrk(server.url, body, 3, connections)["rps"])
        finally:
            one.stop()
            two.stop()
        scaling = {label: _median(values) for label, values in scaling_runs.items()}
        scaling["ratio"] = round(sum(scaling_runs["2_worker"]) / sum(scaling_runs["1_worker"]), 3)
        scaling["rounds"] = scaling_runs
        results["scaling"] = scaling
    return results


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
