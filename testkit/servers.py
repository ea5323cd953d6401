"""The real server as deployed (``retry-webhook serve``: granian workers, TLS) in a subprocess,
and HTTPS/metrics clients for it. Logs go to a file (a pipe nobody reads would fill up
and block the server under load); ``logs()`` reads them back as JSON lines.

Deadlines here and in the tests scale with the machine (``scaled``): a busy machine
makes a start or an answer slower, never wrong. Servers start a few at a time
(``start_slot``), across every pytest process of this user, so a suite on a loaded
machine does not start them all at once and time them all out together. Each server
runs in a session (process group) of its own, killed whole when it fails to start."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

BIN = Path(sys.executable).parent / "retry-webhook"

#: Every deadline of the tests is multiplied by this (``.ci/run`` sets it for CI runners).
TIME_FACTOR_ENV = "RPW_TEST_TIME_FACTOR"
#: How many servers may be starting at once, across pytest processes (default: a CPU of
#: two per start).
STARTS_ENV = "RPW_TEST_SERVER_STARTS"
#: Set in each server's environment (and so its workers', controller's and metrics
#: process's): ``marked`` finds them by it.
MARK_ENV = "RPW_TEST_SERVER"
#: The deadline of a start on an idle machine; see ``start_deadline``.
START_SECONDS = 30.0
#: Set by tests/conftest.py while a test outside the ``slow`` tier runs: it may not start one.
IN_FAST_TEST = False


def time_factor() -> float:
    """How much longer than on an idle machine a wait may take: ``RPW_TEST_TIME_FACTOR``
    (default 1) times the load per CPU over the last minute, when that is above 1."""
    try:
        given = float(os.environ.get(TIME_FACTOR_ENV) or 1.0)
    except ValueError:
        given = 1.0
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return max(1.0, given) * max(1.0, load)


def scaled(seconds: float) -> float:
    """``seconds`` of an idle machine, as a deadline on this one now."""
    return seconds * time_factor()


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
        mark: str = "",
    ):
        self.cert_dir = cert_dir
        self.port = port
        self.proc = proc
        self.log_path = log_path
        self.metrics_port = metrics_port
        self.context: ssl.SSLContext | None = None
        #: This server's ``RPW_TEST_SERVER``: its processes are ``marked(server.mark)``.
        self.mark = mark

    def request(self, method, path, body=None, headers=None, host="localhost"):
        conn = http.client.HTTPSConnection(
            host, self.port, context=self.context, timeout=scaled(10)
        )
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
        """The output as JSON objects; fails on any line that is not JSON. A last line
        without its newline is still being written (the server runs on): left for later."""
        text = self.output()
        if not text.endswith("\n"):
            text = text.rpartition("\n")[0]
        lines = [line for line in text.splitlines() if line.strip()]
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                raise AssertionError(f"not a JSON log line: {line!r}") from None
        return out

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """One scrape: {(sample name, sorted labels): value}."""
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=scaled(10))
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
    port: int = 0,
) -> Server:
    """``retry-webhook serve`` in a session of its own, on ``port`` or a free one; with
    ``wait``, once it is ready (every worker answering), holding one of the start slots
    meanwhile."""
    assert not IN_FAST_TEST, "a test that starts a server must be marked slow (tests/conftest.py)"
    port = port or free_port()
    log_path = log_path or cert_dir.parent / f"server-{port}.log"
    mark = uuid.uuid4().hex
    if preexec_fn is os.setsid:
        preexec_fn = None  # every server has a session of its own already
    handle = open(log_path, "w", encoding="utf-8")
    with start_slot() if wait else contextlib.nullcontext():
        began = time.monotonic()
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
            env={**os.environ, **(env or {}), MARK_ENV: mark},
            start_new_session=True,
            preexec_fn=_with_parent_death(preexec_fn),
        )
        handle.close()
        server = Server(cert_dir, port, proc, log_path, metrics_port, mark)
        if wait:
            try:
                _await_ready(server, workers, start_deadline())
            except BaseException:
                kill_group(server)  # nothing of a failed start outlives it
                raise
            _STARTS.append(time.monotonic() - began)
    return server


#: How long each start of this process took (``start_deadline`` allows a multiple).
_STARTS: list[float] = []


def start_deadline() -> float:
    """How long a start may take: ``START_SECONDS`` scaled, or five times the slowest
    start so far when that is longer (the machine has shown how slow it is)."""
    return max(scaled(START_SECONDS), 5 * max(_STARTS, default=0.0))


def _await_ready(server: Server, workers: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise AssertionError(f"server exited: {server.output()}")
        try:
            server.context = ssl.create_default_context(cafile=str(server.cert_dir / "ca.crt"))
            if server.request("GET", "/readyz")[0] == 200:
                all_workers_serving(server, workers, deadline)
                return
        except (OSError, ssl.SSLError):
            time.sleep(0.1)
    tail = server.output()[-4000:]
    raise AssertionError(f"server not ready within {seconds:.0f} s; its log ends:\n{tail}")


@contextlib.contextmanager
def start_slot() -> Iterator[None]:
    """One of ``RPW_TEST_SERVER_STARTS`` slots (a CPU of two per start by default), as a
    file lock shared by every pytest process of this user (xdist workers, threads)."""
    try:
        slots = int(os.environ.get(STARTS_ENV) or 0)
    except ValueError:
        slots = 0
    slots = slots if slots > 0 else max(1, (os.cpu_count() or 1) // 2)
    directory = Path(tempfile.gettempdir()) / f"rpw-test-starts-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    # The others' starts are bounded by their own deadlines (or their process's end).
    deadline = time.monotonic() + scaled(20 * START_SECONDS)
    while True:
        for index in range(slots):
            fd = os.open(directory / f"slot-{index}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield
            finally:
                os.close(fd)  # releases the lock
            return
        assert time.monotonic() < deadline, f"no server start slot free in {directory}"
        time.sleep(0.05)


_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def _with_parent_death(preexec_fn):
    """A server started from the main thread gets SIGTERM when pytest dies (even by
    SIGKILL). Not from another thread: the signal comes when the thread that started
    the process ends (``PR_SET_PDEATHSIG``), long before the test is done with it."""
    if _PRCTL is None or threading.current_thread() is not threading.main_thread():
        return preexec_fn
    prctl, term = _PRCTL, int(signal.SIGTERM)

    def child() -> None:
        prctl(1, term, 0, 0, 0)  # PR_SET_PDEATHSIG
        if preexec_fn is not None:
            preexec_fn()

    return child


def kill_group(server: Server) -> None:
    """SIGKILL to the server's whole session (workers, controller, metrics process), then
    the server reaped and its metrics directory removed (``remove_metrics_dir``). Only
    while it is not reaped yet: its pid is the group's name."""
    if server.proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(scaled(10))
    remove_metrics_dir(server)


def metrics_dir(server: Server) -> Path | None:
    """The metrics directory the server made under ``$TMPDIR``, as its log names it
    (``None``: none, or not yet logged)."""
    text = server.output()
    for line in text.splitlines():
        if '"metrics"' in line:
            with contextlib.suppress(ValueError):
                found = json.loads(line)
                if found.get("msg") == "metrics" and found.get("dir"):
                    return Path(found["dir"])
    return None


def remove_metrics_dir(server: Server) -> None:
    """A killed server's metrics directory, removed once its last process is gone, as the
    next server to start in that ``$TMPDIR`` would remove it
    (``metricsdir.remove_dead_dirs``): for a test that kills a server and starts none
    after it (tests/conftest.py fails a run that leaves one behind)."""
    from webhook.serving import metricsdir

    directory = metrics_dir(server)
    if directory is None or metricsdir.owner(directory) is None:
        return  # none, or one the test gave it (``PROMETHEUS_MULTIPROC_DIR``): the test's
    eventually(lambda: metricsdir.dead(directory) or not directory.exists())
    shutil.rmtree(directory, ignore_errors=True)


def marked(mark: str, name: str = MARK_ENV) -> list[int]:
    """Live processes (not zombies) that started with ``name=mark`` in their environment:
    the processes of one server (``RPW_TEST_SERVER``), or all a pytest process started."""
    wanted = f"{name}={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                if stat.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    continue
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if wanted in environ.read().split(b"\0"):
                    found.append(int(entry))
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return found


def command(pid: int) -> str:
    """A process's command line, for a message."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


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


def all_workers_serving(server: Server, workers: int, deadline: float | None = None) -> None:
    """Until every worker has loaded the app and answered (their pids in the decision
    logs): a test that changes files must not race a worker still starting up."""
    if workers < 2:
        return
    deadline = deadline or time.monotonic() + scaled(10)
    while True:
        server.review("/mutate", OTHER)
        pids = {line["pid"] for line in server.logs() if line.get("msg") == "admission decision"}
        if len(pids) >= workers:
            return
        assert time.monotonic() < deadline, f"only {len(pids)} of {workers} workers answered"
        time.sleep(0.02)


def stop(server: Server) -> None:
    """SIGTERM, as a rolling update stops it; its whole session killed if it lingers."""
    server.proc.terminate()
    try:
        server.proc.wait(scaled(15))
    except subprocess.TimeoutExpired:
        kill_group(server)


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
        timeout=scaled(60),
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
    """Poll ``check`` until it returns a truthy value (returned) or the time is up
    (``timeout`` seconds of an idle machine, ``scaled``)."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {scaled(timeout):.0f}s")
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
            thread.join(scaled(self.join_timeout))


def worker_pids(master: int) -> set[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(master)], capture_output=True, text=True, check=False
    ).stdout
    return {int(pid) for pid in out.split()}
