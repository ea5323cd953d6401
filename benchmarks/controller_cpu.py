"""What the leading controller costs admission: ``python -m benchmarks.controller_cpu``.

The real server (``retry-webhook serve``: granian workers, TLS, a log line per decision)
with a cluster connection, the test suite's HTTP Kubernetes API (``testkit/fakeapi/``)
read by the real ``kubernetes`` client, is started in turn with its controller (which
takes the Lease and leads) and with ``--no-controller``, round after round, against the
same API. While each runs, ``Feeder`` plays a cluster whose annotated Jobs keep losing
pods (the Job controller's and the kubelet's part from ``testkit/jobsim.py``): pods
OOM-killed (the leader writes the Job's failure history), pods preempted
(``DisruptionTarget``: the leader counts the disruption on the Job and writes an Event)
and retry pods held behind our scheduling gate (the leader releases each when its
``not-before`` comes). Admission's own informers see the same stream either way; only
the controller, and what its writes make the informers read, differ.

Meanwhile ``benchmarks.https.paced`` offers a fixed rate of real AdmissionReviews and
reports p50 and p99. CPU time is read from /proc per process: the admission side (the
supervisor and its workers) and the controller process apart, so the ratio with / without
is the admission workers' own. The controller's writes in each window are counted at the
fake API, so a round in which the controller idled is visible in the results.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

from benchmarks import https, report
from benchmarks.cases import streams
from testkit.builders import P, job
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.jobsim import T0, JobRun
from testkit.workloads import mutate
from webhook.kube import gates
from webhook.policy.grammar import format_time
from webhook.tls import certs

#: The three kinds of annotated Jobs the feeder's pods belong to.
OOM = {
    P + "oom-memory-factor": "1.5",
    P + "oom-memory-limit": "64Gi",
    P + "avoid-failed-nodes": "true",
    P + "backoff-limit": "1000",
}
DISRUPTED = {P + "ignore-disruptions": "true", P + "max-disruptions": "3", P + "backoff-limit": "3"}
DELAYED = {P + "retry-delay": "30s", P + "backoff-limit": "1000"}
CONTAINERS = [
    {
        "name": "trainer",
        "image": "ghcr.io/example/trainer:1.4.2",
        "resources": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"memory": "16Gi"}},
    }
]
#: The AdmissionReview offered at the fixed rate: a pipeline's annotated Job
#: (``benchmarks.cases``), answered by the policy engine, not by the cluster.
CASE = "job-annotated"


def admitted(annotations: dict[str, str], name: str) -> dict:
    """A Job as stored after the webhook admitted it (its rules, its template's keys)."""
    verdict, out = mutate(job(annotations, name=name, containers=copy.deepcopy(CONTAINERS)))
    if not verdict.allowed:
        raise RuntimeError(verdict.message)
    out["metadata"]["uid"] = str(uuid.uuid4())
    out["status"] = {}
    return out


class Feeder:
    """A stream of pod failures for annotated Jobs, ``per_second`` steps a second, each
    step one of: a pod OOM-killed, a pod preempted, a retry pod gated for ``gate_delay``
    seconds. Every pod it made is deleted ``keep`` seconds later (or by ``clean``), so the
    API's store stays the same size from round to round."""

    def __init__(
        self, api: FakeAPI, jobs_per_kind: int = 30, per_second: float = 12.0, keep: float = 4.0
    ):
        self.api = api
        self.per_second = per_second
        self.keep = keep
        self.gate_delay = 1.0
        self.runs = {
            kind: [JobRun.store(api, admitted(policy, f"{kind}-{i}")) for i in range(jobs_per_kind)]
            for kind, policy in (("oom", OOM), ("disrupted", DISRUPTED), ("delayed", DELAYED))
        }
        self.made: list[tuple[float, str]] = []  # (when, pod uid)
        self.steps = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        kinds = ("oom", "disrupted", "delayed")
        step = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            kind = kinds[step % 3]
            run = self.runs[kind][(step // 3) % len(self.runs[kind])]
            getattr(self, kind)(run)
            self.steps[kind] += 1
            step += 1
            self._forget(time.monotonic() - self.keep)
            next_at += 1 / self.per_second
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def oom(self, run: JobRun) -> None:
        """The kubelet OOM-kills the pod's container; the Job controller judges it."""
        pod = run.new_pod()
        self.made.append((time.monotonic(), pod["metadata"]["uid"]))
        pod = run.current(pod)
        pod["status"]["phase"] = "Failed"
        for status in pod["status"]["containerStatuses"]:
            status["state"] = {
                "terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": T0}
            }
        self.api.put("pods", pod)
        run.judge(pod)

    def disrupted(self, run: JobRun) -> None:
        """Preempted: ``DisruptionTarget``, deleted, stopped (143), judged."""
        pod = run.new_pod()
        self.made.append((time.monotonic(), pod["metadata"]["uid"]))
        run.disrupt(pod)
        run.fail(pod)
        run.judge(pod)

    def delayed(self, run: JobRun) -> None:
        """A retry pod as the webhook held it back (``webhook.kube.gates``)."""
        pod = run.new_pod()
        self.made.append((time.monotonic(), pod["metadata"]["uid"]))
        pod = run.current(pod)
        meta = pod["metadata"]
        meta["labels"][gates.GATED_LABEL] = gates.GATED_VALUE
        meta["annotations"][gates.NOT_BEFORE] = format_time(time.time() + self.gate_delay)
        pod["spec"]["schedulingGates"] = [{"name": gates.GATE}]
        pod["spec"].pop("nodeName", None)
        pod["status"] = {"phase": "Pending"}
        self.api.put("pods", pod)

    def _forget(self, before: float) -> None:
        while self.made and self.made[0][0] < before:
            _, uid = self.made.pop(0)
            self._delete(uid)

    def _delete(self, uid: str) -> None:
        with self.api.lock:
            if uid not in self.api.objects["pods"]:
                return
        self.api.remove_finalizer(uid)
        with self.api.lock:
            present = uid in self.api.objects["pods"]
        if present:
            self.api.delete("pods", uid)

    def clean(self) -> None:
        """Every pod made so far goes (between windows, when nothing is measured)."""
        self._forget(float("inf"))


def controller_writes(api: FakeAPI, start: int) -> dict:
    """What reached the fake API since request ``start``: Events created, Job patches
    (history records and disruption counts) and pod patches (gate releases, conditions)."""
    with api.lock:
        seen = list(api.requests[start:])
    counts = Counter()
    for call, _query in seen:
        method, _, path = call.partition(" ")
        if method == "POST" and path.endswith("/events"):
            counts["events_created"] += 1
        elif method == "PATCH" and "/jobs/" in path:
            counts["job_patches"] += 1
        elif method == "PATCH" and "/pods/" in path:
            counts["pod_patches"] += 1
        elif method in ("PATCH", "PUT") and "/events/" in path:
            counts["events_updated"] += 1
    return dict(counts)


class Replica(https.Served):
    """``retry-webhook serve`` against the fake API: with its controller or without."""

    def __init__(self, cert_dir: Path, kubeconfig: Path, log: Path, controller: bool, workers: int):
        extra = ("--kube", "kubeconfig", "--lease-namespace", "default")
        if not controller:
            extra += ("--no-controller",)
        self.log = log
        self.ca = cert_dir / "ca.crt"
        env = {"KUBECONFIG": str(kubeconfig), "POD_NAME": log.stem}
        super().__init__("webhook", cert_dir, workers, 8, extra, log=log, env=env)
        self.metrics_port = int(self.cmd[self.cmd.index("--metrics-port") + 1])

    def readyz(self) -> dict:
        try:
            return json.loads(https._get(self.port, self.ca, "/readyz", 2))
        except OSError as err:  # 503 while a cache syncs: its body says the same
            body = getattr(err, "read", lambda: b"{}")()
            return json.loads(body or b"{}")

    def wait_leading(self, leading: bool, timeout: float = 30) -> None:
        """Until it is ready and leads (or, without a controller, is ready)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.readyz()
            lead = bool(state.get("controller", {}).get("leader"))
            if state.get("status") == "ready" and lead == leading:
                return
            time.sleep(0.2)
        raise RuntimeError(f"not {'leading' if leading else 'ready'}: {self.readyz()}")

    def controller_pid(self) -> int | None:
        for line in self.log.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("msg") == "controller started":
                return int(entry["controller_pid"])
        return None

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: the admission side (supervisor and workers), the controller."""
        controller = self.controller_pid()
        out = {"admission": https.cpu_seconds(self.proc.pid), "controller": 0.0}
        for pid in https._children(self.proc.pid):
            out["controller" if pid == controller else "admission"] += https.cpu_seconds(pid)
        return out

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics") as answer:
            return answer.read().decode()


def window(
    replica: Replica, api: FakeAPI, feeder: Feeder, body: Path, seconds: int, rate: int
) -> dict:
    """One measured window: the feeder's stream and the paced AdmissionReviews at once."""
    feeder.start()
    try:
        https.paced(replica.url, body, 2, rate)  # warm-up: connections, the feeder's pace
        first = len(api.requests)
        steps = sum(feeder.steps.values())
        before, own = replica.cpu(), time.process_time()
        report = https.paced(replica.url, body, seconds, rate)
        after, own = replica.cpu(), time.process_time() - own
        writes = controller_writes(api, first)
        steps = sum(feeder.steps.values()) - steps
    finally:
        feeder.stop()
        feeder.clean()
    answered = round(report["achieved_rps"] * seconds)
    admission = after["admission"] - before["admission"]
    controller = after["controller"] - before["controller"]
    return {
        **report,
        "requests": answered,
        "admission_cpu_us": round(admission / max(answered, 1) * 1e6, 1),
        "admission_cores": round(admission / seconds, 3),
        "controller_cores": round(controller / seconds, 3),
        "controller_cpu_ms_per_pod": round(controller / max(steps, 1) * 1000, 2),
        # The fake API and the feeder (this process), which share the 2 cores.
        "cluster_cores": round(own / seconds, 3),
        "pod_steps": steps,
        "controller_writes": writes,
    }


#: The servers of a round, in turn: with the controller (leading), without it, and a
#: second one without it, whose difference from the first is the machine's noise.
ARMS = {"with": True, "without": False, "twin": False}


def run(
    rounds: int = 8,
    seconds: int = 10,
    rate: int = 500,
    per_second: float = 12.0,
    workers: int = 2,
    arms: dict[str, bool] = ARMS,
) -> dict:
    """``rounds`` of each arm in turn, one server at a time, against one fake API."""
    if shutil.which("hey") is None:
        raise SystemExit("hey not found: apt-get install hey")
    results: dict = {
        "settings": {
            "rounds": rounds,
            "seconds": seconds,
            "offered_rps": rate,
            "pod_steps_per_second": per_second,
            "workers": workers,
            "threads": 8,
            "case": CASE,
        },
        "rounds": {name: [] for name in arms},
    }
    api = FakeAPI(page_size=500).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cert_dir = Path(tmp) / "certs"
            certs.generate(cert_dir, extra_dns=["localhost"])
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", api.url)
            body = Path(tmp) / "body.json"
            body.write_bytes(streams()[CASE][0])
            feeder = Feeder(api, per_second=per_second)
            results["settings"]["annotated_jobs"] = sum(map(len, feeder.runs.values()))
            for index in range(rounds):
                for name, leading in arms.items():
                    log = Path(tmp) / f"{name}-{index}.log"
                    replica = Replica(cert_dir, kubeconfig, log, leading, workers)
                    try:
                        replica.wait_leading(leading)
                        measured = window(replica, api, feeder, body, seconds, rate)
                        if leading:
                            measured["controller_metrics"] = _controller_metrics(replica)
                    finally:
                        replica.stop()
                    measured["order"] = sum(map(len, results["rounds"].values()))
                    results["rounds"][name].append(measured)
    finally:
        api.stop()
    results.update(summary(results["rounds"]))
    return results


def _controller_metrics(replica: Replica) -> dict:
    """The controller's own counters, from the server's metrics."""
    wanted = ("retry_webhook_retry_delay_gates_released_total", "retry_webhook_events")
    out: dict[str, float] = {}
    try:
        text = replica.metrics()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith(wanted):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


KEYS = ("admission_cpu_us", "p50_ms", "p99_ms")


def summary(rounds: dict[str, list[dict]]) -> dict:
    """Medians per arm, and the ratios against the arm without the controller: of the
    medians, and paired (each window against the windows without the controller just
    before and just after it, median). The twin's ratios are the calibration: two
    identical servers."""
    sides: dict[str, dict] = {}
    for name, seen in rounds.items():
        side: dict = {
            key: round(statistics.median(r[key] for r in seen), 3)
            for key in (
                *KEYS,
                "admission_cores",
                "controller_cores",
                "controller_cpu_ms_per_pod",
                "cluster_cores",
            )
        }
        side["errors"] = sum(r["errors"] for r in seen)
        side["min_achieved_rps"] = min(r["achieved_rps"] for r in seen)
        side["pod_steps"] = sum(r["pod_steps"] for r in seen)
        writes: Counter = Counter()
        for r in seen:
            writes.update(r["controller_writes"])
        side["controller_writes"] = dict(writes)
        side["rounds_it_worked"] = sum(1 for r in seen if worked(r["controller_writes"]))
        sides[name] = side
    base = rounds["without"]

    def paired(other: list[dict], key: str) -> float:
        out = []
        for mine in other:
            before = [r for r in base if r["order"] < mine["order"]][-1:]
            after = [r for r in base if r["order"] > mine["order"]][:1]
            around = [r[key] for r in before + after]
            out.append(mine[key] / statistics.mean(around))
        return round(statistics.median(out), 3)

    result: dict = {"arms": sides}
    for name in rounds:
        if name == "without":
            continue
        result[name] = {
            "ratio": {key: round(sides[name][key] / sides["without"][key], 3) for key in KEYS},
            "paired": {key: paired(rounds[name], key) for key in KEYS},
        }
    return result


def worked(writes: dict) -> bool:
    """Whether a window's writes show the controller at work: Events, Job records, gates."""
    return all(writes.get(k, 0) > 0 for k in ("events_created", "job_patches", "pod_patches"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="two short rounds (smoke test)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--write", action="store_true", help="also write results/controller.*")
    args = parser.parse_args()
    from benchmarks import controller

    if args.quick:
        result = run(rounds=2, seconds=3, rate=args.rate)
    else:
        result = run(rounds=args.rounds, seconds=args.seconds, rate=args.rate)
    if not args.write:
        print(json.dumps(result, indent=2))
        return
    # The controller's cost alone, beside the full run's latest.*: its CPU and memory.
    results = {"machine": report.machine(), "controller_cpu": result}
    results["controller_memory"] = controller.run()
    (report.RESULTS / "controller.json").write_text(json.dumps(results, indent=2) + "\n")
    table = report.controller_markdown(results)
    (report.RESULTS / "controller.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
