"""The real control plane's processes: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, each run from ``.cluster/bin/kcp`` (our one main over upstream's own
``app`` packages and ``etcdmain``, built by ``cluster/build``), on 127.0.0.1.

The flags are upstream's own; what each one is for is said beside it. Everything the
components write (etcd's data, logs) lives in the cluster's directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from testkit.controlplane.pki import PKI, SERVICE_CIDR

#: The repository, and where ``cluster/build`` puts the binaries it builds.
ROOT = Path(__file__).resolve().parents[2]
KCP = ROOT / ".cluster" / "bin" / "kcp"
JOBSET = ROOT / ".cluster" / "bin" / "jobset-controller"
BUILD = ROOT / "cluster" / "build"

#: Feature gates the annotations rely on, all beta and on by default in 1.37, named so that
#: a release that turns one off fails loudly here instead of silently in a test: container
#: restart rules (``in-place-exit-codes``), their RestartAllContainers action
#: (``in-place-scope: pod``), and DRA device taints (DisruptionTarget
#: ``DeletionByDeviceTaintManager``).
FEATURE_GATES = {
    "ContainerRestartRules": True,
    "RestartAllContainersOnContainerExits": True,
    "DRADeviceTaints": True,
}

#: The admission plugins the chart relies on (beside the defaults the API server enables
#: anyway): LimitRanger mutates a pod before our webhook sees it (plugin order in
#: pkg/kubeapiserver/options/plugins.go), the webhooks and the ValidatingAdmissionPolicy that
#: narrows our controller's writes.
ADMISSION_PLUGINS = [
    "NamespaceLifecycle",
    "LimitRanger",
    "ServiceAccount",
    "DefaultTolerationSeconds",
    "Priority",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionWebhook",
    "ResourceQuota",
]

#: The controllers of kube-controller-manager that act on what we write or read: Jobs and
#: CronJobs, PodGC (pods of lost nodes: ``DeletionByPodGC``), the garbage collector (a
#: Job's pods go with it), TTL after finished, node lifecycle and taint eviction (an
#: unreachable node's pods: ``DeletionByTaintManager``), the resource claim controller (a
#: pod's ResourceClaims made from its templates, which the scheduler allocates), device
#: taint eviction (``DeletionByDeviceTaintManager``), the disruption controller (it resets a stale
#: DisruptionTarget: ``syncStalePodDisruption``), and the ServiceAccount and namespace
#: controllers a namespace needs before it can hold pods and be deleted.
CONTROLLERS = [
    "job-controller",
    "cronjob-controller",
    "pod-garbage-collector-controller",
    "garbage-collector-controller",
    "ttl-after-finished-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "resourceclaim-controller",
    "device-taint-eviction-controller",
    "disruption-controller",
    "serviceaccount-controller",
    "namespace-controller",
]


@dataclass(frozen=True)
class Ports:
    etcd: int
    etcd_peer: int
    apiserver: int


@dataclass(frozen=True)
class Timing:
    """What the cluster's clocks are set to. ``job_pod_failure_backoff``: the Job
    controller's delay before a failed pod's replacement (``DefaultJobPodFailureBackOff``,
    10 s upstream, doubling), which upstream's own integration tests shorten the same way
    (test/integration/job: ``setDurationDuringTest``); ``node_monitor_grace_period``: how
    long a Node may go without a heartbeat before the node lifecycle controller marks it
    unreachable (50 s upstream; the played kubelet renews every 2 s)."""

    job_pod_failure_backoff: str = "10s"
    node_monitor_grace_period: str = "50s"


def etcd_args(directory: Path, ports: Ports) -> list[str]:
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    client = f"http://127.0.0.1:{ports.etcd}"
    return [
        "etcd",
        "--name=kcp",
        f"--data-dir={directory / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=kcp={peer}",
        "--log-level=warn",
        # A throwaway cluster on a shared disk: no fsync (what etcd's own tests and
        # upstream's local-up-cluster allow), so a busy disk does not stall the API server.
        "--unsafe-no-fsync",
    ]


def apiserver_args(pki: PKI, ports: Ports) -> list[str]:
    issuer = "https://kubernetes.default.svc.cluster.local"
    gates = ",".join(f"{name}={str(on).lower()}" for name, on in FEATURE_GATES.items())
    return [
        "kube-apiserver",
        f"--etcd-servers=http://127.0.0.1:{ports.etcd}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca}",
        "--authorization-mode=RBAC",
        f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
        f"--service-account-issuer={issuer}",
        f"--api-audiences={issuer}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        f"--feature-gates={gates}",
        "--profiling=false",
        # The kubernetes Service's endpoints would be the advertised address, which may
        # not be loopback; nothing in this cluster calls it through the Service.
        "--endpoint-reconciler-type=none",
        # No kubelet serves logs or exec here.
        "--kubelet-preferred-address-types=InternalIP",
        "--v=0",
    ]


def controller_manager_args(pki: PKI, timing: Timing) -> list[str]:
    kubeconfig = pki.kubeconfig("controller-manager")
    return [
        "kube-controller-manager",
        # Our main's own flag (cluster/cmd/kcp): the Job controller's pod failure back-off.
        f"--kcp-job-pod-failure-backoff={timing.job_pod_failure_backoff}",
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--controllers={','.join(CONTROLLERS)}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        "--secure-port=0",
        # One ServiceAccount per controller (as kubeadm runs it), so each acts with the
        # role the RBAC bootstrap policy gives that controller.
        "--use-service-account-credentials=true",
        f"--node-monitor-grace-period={timing.node_monitor_grace_period}",
        "--node-monitor-period=2s",
        f"--root-ca-file={pki.ca}",
        "--v=0",
    ]


def scheduler_args(pki: PKI) -> list[str]:
    kubeconfig = pki.kubeconfig("scheduler")
    return [
        "kube-scheduler",
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        "--secure-port=0",
        "--v=0",
    ]


def spawn(
    argv: list[str], log: Path, env: dict | None = None, preexec: Callable | None = None
) -> subprocess.Popen:
    """A component in a session of its own (so that ``stop`` ends it and all it started),
    its output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, **(env or {})}
    # The components talk to each other and to our webhook on loopback only.
    environment["NO_PROXY"] = environment["no_proxy"] = "127.0.0.1,localhost"
    with log.open("ab") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environment,
            start_new_session=True,
            preexec_fn=preexec,
        )


def stop_pid(pid: int, timeout: float = 15.0) -> None:
    """SIGTERM to the process's session, then SIGKILL after ``timeout``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Running, not a zombie (a child not reaped yet counts as gone)."""
    with contextlib.suppress(ValueError):
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False
    return state != "Z"


def wait_http(
    url: str,
    deadline: float,
    what: str,
    proc: subprocess.Popen | None = None,
    log: Path | None = None,
    context: ssl.SSLContext | None = None,
) -> None:
    """Wait until ``url`` answers 200 (a health endpoint), or fail saying what did not
    start, with the end of its log."""
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(url, timeout=5, context=context) as answer:
                if answer.status == 200:
                    return
        except OSError as err:
            last = str(err)
        time.sleep(0.2)
    tail = ""
    if log is not None and log.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    exited = "" if proc is None or proc.poll() is None else f" (exited {proc.returncode})"
    raise RuntimeError(f"{what} did not become healthy at {url}{exited}: {last}\n{tail}")


def wait_until_listening(
    url: str, deadline: float, log: Path, context: ssl.SSLContext | None = None
) -> None:
    """Wait until an HTTPS server answers at ``url`` at all (any status: a webhook server
    has no health path of its own)."""
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5, context=context):
                return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError as err:
            last = str(err)
        time.sleep(0.2)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.exists() else ""
    raise RuntimeError(f"nothing answers at {url}: {last}\n{tail}")


def client_context(pki: PKI, who: str = "admin") -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(str(pki.client_cert(who)), str(pki.client_key(who)))
    return context
