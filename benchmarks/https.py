"""Over HTTPS: the real server (``retry-webhook serve``: gunicorn, TLS, production
settings) under load from real load generators, against the floor served the same way.

- saturated: ``wrk`` with keep-alive connections, throughput and latency percentiles;
- fixed rate: ``hey`` at 500 requests/s offered, p50 and p99 from every request's time;
- scaling: the same saturated run with one worker process and with two (the closest this
  2-core machine gets to "a second replica").

Request bodies are real AdmissionReviews (benchmarks/cases.py).
"""

from __future__ import annotations

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
                "--log-level",
                "warning",
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


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def wrk(url: str, body_file: Path, seconds: int, connections: int) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(LUA)
    try:
        out = subprocess.run(
            [
                "wrk",
                "-t",
                "1",
                "-c",
                str(connections),
                "-d",
                f"{seconds}s",
                "--latency",
                "-s",
                script.name,
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "BODY_FILE": str(body_file)},
        ).stdout
    finally:
        os.unlink(script.name)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    latency = {p: _ms(v) for p, v in re.findall(r"^\s+(50|90|99)%\s+(\S+)", out, re.M)}
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": round(rps, 1),
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


def run(seconds: int = 10, workers: int = 2, threads: int = 8, connections: int = 16) -> dict:
    for tool in ("wrk", "hey"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: apt-get install {tool}")
    cases = all_cases()
    results: dict = {
        "settings": {
            "seconds": seconds,
            "workers": workers,
            "threads": threads,
            "connections": connections,
        },
        "cases": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        cert_dir = Path(tmp) / "certs"
        certs.generate(cert_dir, extra_dns=["localhost"])
        for name in ("job-plain", "job-annotated", "pod-last-attempt"):
            body = Path(tmp) / f"{name}.json"
            body.write_bytes(cases[name])
            entry: dict = {}
            for which in ("floor", "webhook"):
                server = Served(which, cert_dir, workers, threads)
                try:
                    wrk(server.url, body, 2, connections)  # warm-up
                    entry[which] = {
                        "saturated": wrk(server.url, body, seconds, connections),
                        "fixed_500rps": hey(server.url, body, seconds, 500),
                    }
                finally:
                    server.stop()
            floor = entry["floor"]["saturated"]["rps"]
            entry["throughput_ratio"] = round(entry["webhook"]["saturated"]["rps"] / floor, 3)
            results["cases"][name] = entry
        body = Path(tmp) / "scale.json"
        body.write_bytes(cases["job-annotated"])
        scaling = {}
        for count in (1, 2):
            server = Served("webhook", cert_dir, count, threads)
            try:
                wrk(server.url, body, 2, connections)
                scaling[f"{count}_worker"] = wrk(server.url, body, seconds, connections)["rps"]
            finally:
                server.stop()
        scaling["ratio"] = round(scaling["2_worker"] / scaling["1_worker"], 3)
        results["scaling"] = scaling
    return results


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
