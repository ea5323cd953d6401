"""The controller as deployed, leading against the test API (``testkit/fakeapi/``), for
the scale envelope (``benchmarks.envelope``, docs/SCALE.md): its requests counted at the
API, its memory read from /proc.

``Leader.process`` starts ``python -m benchmarks.leader``, a process whose body is the
controller process's own (``webhook.serving.controlproc.run_controller``: the Lease on
its own client; every reconciler of ``webhook.controller.reconcilers.build`` under
``manager.Manager``, writing through ``fence.fenced_client`` and its two token buckets,
``ratelimit.Limits``), as ``retry-webhook serve`` forks it, without the admission workers
and without metrics (no metrics port). ``Leader.thread`` builds the same objects the same
way on a thread of the caller's process (the harness's tests: no program to start).

What the controller wrote is read at the API (``writes``): every POST, PUT, PATCH and
DELETE it sent, by what it wrote, the Lease's left out; the ones the API refused
(a 409 Conflict, for one) are counted as sent, and apart (``refused``).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from testkit.fakeapi import FakeAPI, write_kubeconfig

NAMESPACE = "default"
LEASE = "retry-policy-webhook-controller"
WRITES = ("POST", "PUT", "PATCH", "DELETE")
#: The controller's watches once it leads (``webhook.controller.reconcilers.build``): pods
#: for the disruption budgets, the peers, the failed pods' histories, the retry-delay
#: gates, the in-place budgets and the verdicts' two (failed pods, and pods they mark);
#: one of Jobs for every reconciler that reads them. A run that starts before they are
#: all open loses what happened meanwhile: ``tests/test_benchmarks.py`` holds the count.
POD_WATCHES = 7
JOB_WATCHES = 1


def what(method: str, path: str) -> str | None:
    """What a request wrote, by its path (``None``: a read, or the Lease)."""
    if method not in WRITES or "/leases" in path:
        return None
    if "/events" in path:
        return "event_create" if method == "POST" else "event_update"
    if "/pods/" in path:
        if method == "DELETE":
            return "pod_delete"
        return "pod_status" if path.endswith("/status") else "pod_patch"
    if "/jobsets/" in path:
        return "jobset_patch"
    if "/jobs/" in path:
        return "job_patch"
    return "other"


def writes(api: FakeAPI, since: int = 0) -> Counter:
    """The controller's writes among the API's requests from index ``since`` on."""
    with api.lock:
        seen = list(api.requests[since:])
    counted: Counter = Counter()
    for call, _query in seen:
        method, _, path = call.partition(" ")
        kind = what(method, path)
        if kind is not None:
            counted[kind] += 1
    return counted


def refused(api: FakeAPI, since: int = 0) -> Counter:
    """The writes the API refused since index ``since`` of its list, by status (409: a
    conflict, the object had changed)."""
    with api.lock:
        return Counter(str(status) for _, _, status in api.failed_writes[since:])


@contextmanager
def cluster_api() -> Iterator[FakeAPI]:
    """The test API the controller and the played cluster share, for a ``with``."""
    api = FakeAPI(page_size=500).start()
    try:
        yield api
    finally:
        api.stop()


class Leader:
    """A leading controller against ``api``; ``stop`` when done, or ``with`` it: leading
    on entry (``wait_leading``), stopped on exit."""

    def __init__(self, api: FakeAPI, workdir: Path) -> None:
        self.api = api
        self.kubeconfig = write_kubeconfig(workdir / f"kubeconfig-{time.monotonic_ns()}", api.url)
        self.log = workdir / "controller.log"
        self.proc: subprocess.Popen | None = None
        #: When it was started (``time.monotonic``).
        self.started = time.monotonic()
        self._manager: Any = None
        self._thread: threading.Thread | None = None

    @classmethod
    def process(
        cls, api: FakeAPI, workdir: Path, qps: float = 50, burst: int = 100, peer_limit: int = 1000
    ) -> Leader:
        leader = cls(api, workdir)
        command = [sys.executable, "-m", "benchmarks.leader"]
        command += ["--qps", str(qps), "--burst", str(burst), "--peer-mark-limit", str(peer_limit)]
        root = Path(__file__).resolve().parent.parent
        with open(leader.log, "w") as out:
            leader.proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=root,
                env={**os.environ, "KUBECONFIG": str(leader.kubeconfig), "POD_NAME": "bench"},
            )
        return leader

    @classmethod
    def thread(
        cls, api: FakeAPI, workdir: Path, qps: float = 50, burst: int = 100, peer_limit: int = 1000
    ) -> Leader:
        from kubernetes import client, config

        from webhook.cluster.events import recorder_for
        from webhook.controller import reconcilers
        from webhook.controller.fence import Fence, fenced_client
        from webhook.controller.manager import ControllerOptions, Manager
        from webhook.controller.ratelimit import Limits
        from webhook.kinds.registry import WORKLOADS

        leader = cls(api, workdir)
        api_client = config.new_client_from_config(str(leader.kubeconfig))
        fence = Fence()  # as run_controller builds them
        acting = fenced_client(api_client.configuration, fence, Limits(qps, burst))
        events, resolver = recorder_for(acting, "bench", WORKLOADS)
        options = ControllerOptions(NAMESPACE, LEASE, "bench", peer_mark_limit=peer_limit)
        built = reconcilers.build(acting, options, events, resolver)
        manager = Manager(client.CoordinationV1Api(api_client), options, built, fence=fence)
        leader._manager = manager
        leader._thread = threading.Thread(target=manager.run, name="leader", daemon=True)
        leader._thread.start()
        return leader

    @classmethod
    def start(cls, api: FakeAPI, workdir: Path, thread: bool = False, **limits: Any) -> Leader:
        """In a process of its own, or on a thread (``thread``)."""
        return (cls.thread if thread else cls.process)(api, workdir, **limits)

    def __enter__(self) -> Leader:
        try:
            self.wait_leading(300)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def leading(self) -> bool:
        """It holds the Lease and every watch of its reconcilers is open."""
        lease = self.api.get("leases", LEASE, NAMESPACE)
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity") or ""
        return (
            holder.startswith("bench")
            and self.api.watcher_count("pods") >= POD_WATCHES
            and self.api.watcher_count("jobs") >= JOB_WATCHES
        )

    def wait_leading(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the controller exited: {self.log.read_text()[-2000:]}")
            if self.leading():
                return
            time.sleep(0.1)
        raise RuntimeError(f"the controller does not lead: {self.log.read_text()[-2000:]}")

    def memory(self) -> dict[str, float]:
        """The controller process's resident memory now and at its peak, MB."""
        if self.proc is None:
            raise RuntimeError("a controller on a thread shares this process's memory")
        found = {}
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found[key] = round(int(value.split()[0]) / 1024, 1)
        return {"rss_mb": found["VmRSS"], "peak_rss_mb": found["VmHWM"]}

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._manager is not None:
            # (not waited for: its Job watch returns only when the watch ends)
            self._manager.stop.set()


def quiet(api: FakeAPI, seconds: float, timeout: float) -> float | None:
    """Wait until the controller has written nothing for ``seconds``; when its last write
    was seen (``time.monotonic``), or ``None``: it was still writing after ``timeout``."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = sum(writes(api).values())
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return since
        time.sleep(0.1)
    return None


def main() -> int:
    """The controller process: ``run_controller`` with these limits, on the kubeconfig's
    API (``KUBECONFIG``), until SIGTERM."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--qps", type=float, default=50.0)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--peer-mark-limit", type=int, default=1000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from webhook.cluster.leadership import LeaderNote
    from webhook.serving.controlproc import run_controller
    from webhook.serving.options import ServeOptions

    options = ServeOptions(
        kube="kubeconfig",
        metrics_port=0,
        lease_namespace=NAMESPACE,
        lease_name=LEASE,
        kube_api_qps=args.qps,
        kube_api_burst=args.burst,
        peer_mark_limit=args.peer_mark_limit,
    )
    return run_controller(options, LeaderNote())


if __name__ == "__main__":
    sys.exit(main())
