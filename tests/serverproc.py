"""The real server as deployed (``retry-webhook serve``: granian workers, TLS) in a subprocess,
and HTTPS/metrics clients for it. Logs go to a file (a pipe nobody reads would fill up
and block the server under load); ``logs()`` reads them back as JSON lines."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

BIN = Path(sys.executable).parent / "retry-webhook"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(
        self,
        cert_dir: Path,
        port: int,
        proc: subprocess.Popen,
        log_path: Path,
        metrics_port: int = 0,
    ):
        self.cert_dir = cert_dir
        self.port = port
        self.proc = proc
        self.log_path = log_path
        self.metrics_port = metrics_port
        self.context: ssl.SSLContext | None = None

    def request(self, method, path, body=None, headers=None, host="localhost"):
        conn = http.client.HTTPSConnection(host, self.port, context=self.context, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.getheader("Content-Type"), response.read()
        finally:
            conn.close()

    def review(self, path, body):
        status, ctype, raw = self.request(
            "POST", path, json.dumps(body), {"Content-Type": "application/json"}
        )
        assert status == 200, raw
        assert ctype == "application/json"
        return json.loads(raw)

    def output(self) -> str:
        """Everything the process wrote to stdout and stderr so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def logs(self) -> list[dict[str, Any]]:
        """The output as JSON objects; fails on any line that is not JSON."""
        lines = [line for line in self.output().splitlines() if line.strip()]
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                raise AssertionError(f"not a JSON log line: {line!r}") from None
        return out

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """One scrape: {(sample name, sorted labels): value}."""
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            assert response.status == 200
            text = response.read().decode()
        finally:
            conn.close()
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def start(
    cert_dir: Path,
    *extra: str,
    wait: bool = True,
    workers: int = 1,
    metrics_port: int = 0,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    preexec_fn=None,
) -> Server:
    port = free_port()
    log_path = log_path or cert_dir.parent / f"server-{port}.log"
    handle = open(log_path, "w", encoding="utf-8")
    proc = subprocess.Popen(
        [
            str(BIN),
            "serve",
            "--cert-dir",
            str(cert_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--kube",
            "off",
            "--workers",
            str(workers),
            "--threads",
            "4",
            "--metrics-port",
            str(metrics_port),
            *extra,
        ],
        stdout=handle,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        preexec_fn=preexec_fn,
    )
    handle.close()
    server = Server(cert_dir, port, proc, log_path, metrics_port)
    if not wait:
        return server
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {server.output()}")
        try:
            server.context = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
            if server.request("GET", "/readyz")[0] == 200:
                all_workers_serving(server, workers)
                return server
        except (OSError, ssl.SSLError):
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("server did not become ready")


OTHER = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "warm-up",
        "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
        "operation": "CREATE",
        "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
    },
}


def all_workers_serving(server: Server, workers: int) -> None:
    """Until every worker has loaded the app and answered (their pids in the decision
    logs): a test that changes files must not race a worker still starting up."""
    if workers < 2:
        return
    for _ in range(400):
        server.review("/mutate", OTHER)
        pids = {line["pid"] for line in server.logs() if line.get("msg") == "admission decision"}
        if len(pids) >= workers:
            return
        time.sleep(0.02)
    raise AssertionError(f"only {len(pids)} of {workers} workers answered")


def stop(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(15)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(5)


def run_serve(cert_dir: Path, *extra: str, port: int = 0) -> subprocess.CompletedProcess:
    """``serve`` run to its end (for starts that must fail), on ``port`` or a free one."""
    return subprocess.run(
        [
            str(BIN),
            "serve",
            "--cert-dir",
            str(cert_dir),
            "--port",
            str(port or free_port()),
            "--host",
            "127.0.0.1",
            "--kube",
            "off",
            "--metrics-port",
            "0",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class KubeletVolume:
    """A directory updated like the kubelet's AtomicWriter updates a Secret volume."""

    def __init__(self, root: Path):
        self.root = root
        self.generation = 0

    def publish(self, files: dict[str, bytes]) -> None:
        self.generation += 1
        target = self.root / f"..2026_11_22_00_00_{self.generation:02d}.{os.getpid()}"
        target.mkdir(mode=0o700)
        for name, data in files.items():
            (target / name).write_bytes(data)
        old = os.readlink(self.root / "..data") if (self.root / "..data").is_symlink() else None
        os.symlink(target.name, self.root / "..data_tmp")
        os.replace(self.root / "..data_tmp", self.root / "..data")  # the atomic swap
        for name in files:
            if not (self.root / name).is_symlink():
                os.symlink(f"..data/{name}", self.root / name)
        if old:
            for entry in (self.root / old).iterdir():
                entry.unlink()
            (self.root / old).rmdir()

    def current(self) -> Path:
        return self.root / os.readlink(self.root / "..data")


def eventually(check, timeout: float = 15.0, interval: float = 0.1):
    """Poll ``check`` until it returns a truthy value (returned) or the time is up."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


class Threads:
    """Load generator threads as a context manager: ``self.threads`` start on enter; on
    exit ``self.stop`` is set and each thread gets ``join_timeout`` seconds to finish."""

    threads: list[threading.Thread]
    stop: threading.Event
    join_timeout = 10.0

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(self.join_timeout)
