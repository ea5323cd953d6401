"""What the cluster tests (tests/controlplane) drive the real control plane with: the real
kubectl with the admin's kubeconfig, the real ``kubernetes`` client, our server started as
deployed against the cluster and restarted with other chart values, and waits for the
conditions a test expects (never for a fixed time).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from kubernetes import client, watch

from testkit import servers
from testkit.controlplane.cluster import Cluster
from testkit.controlplane.webhook import Release, tool

NO_PROXY = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
#: A pod spec part: evicted at once when its node becomes unreachable
#: (DefaultTolerationSeconds would give 300 s otherwise).
UNREACHABLE_AT_ONCE = {
    "tolerations": [
        {
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 0,
        }
    ]
}


def eventually(check: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """Poll ``check`` until it returns something truthy (returned), for at most
    ``timeout`` seconds of an idle machine (``servers.scaled``); the failure says what."""
    deadline = time.monotonic() + servers.scaled(timeout)
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"not within {servers.scaled(timeout):.0f} s: {what} (last: {last!r})")


@dataclass
class Kube:
    """The admin's hands on the cluster: the real kubectl and the ``kubernetes`` client."""

    cluster: Cluster
    _client: Any = field(default=None, repr=False)

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        argv = [tool("kubectl"), "--kubeconfig", str(self.cluster.kubeconfig), *args]
        done = subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            env={**os.environ, **NO_PROXY},
            timeout=servers.scaled(60),
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.returncode}\n{done.stderr}")
        return done

    def apply(self, obj: dict | str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        text = obj if isinstance(obj, str) else yaml.safe_dump(obj)
        return self.kubectl("apply", "-f", "-", *args, stdin=text, check=check)

    def get(self, kind: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        args = ["get", kind, name, "-o", "json"] + (["-n", namespace] if namespace else [])
        done = self.kubectl(*args, check=False)
        if done.returncode != 0:
            if "NotFound" in done.stderr:
                return None
            raise AssertionError(done.stderr)
        return json.loads(done.stdout)

    def list(self, kind: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        args = ["get", kind, "-n", namespace, "-o", "json"]
        if selector:
            args += ["-l", selector]
        return json.loads(self.kubectl(*args).stdout)["items"]

    @property
    def api(self):
        if self._client is None:
            self._client = self.cluster.api_client()
        return self._client

    def core(self):
        return client.CoreV1Api(self.api)

    def batch(self):
        return client.BatchV1Api(self.api)

    def namespace(self, prefix: str, labels: dict[str, str] | None = None) -> str:
        clean = re.sub(r"[^a-z0-9-]+", "-", prefix.lower())[:40].strip("-")
        name = f"{clean}-{uuid.uuid4().hex[:6]}"
        meta = {"name": name, "labels": labels or {}}
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": meta})
        # The ServiceAccount admission plugin refuses pods until the controller made
        # the namespace's default ServiceAccount.
        eventually(lambda: self.get("serviceaccount", "default", name), 30, "default SA")
        return name

    # --- Jobs and their pods ----------------------------------------------------------

    def pods_of(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """A Job's pods as the Job controller made them, oldest first."""
        pods = self.list("pods", namespace, f"batch.kubernetes.io/job-name={job}")
        return sorted(
            pods, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"])
        )

    def job_condition(self, namespace: str, job: str, kind: str) -> dict[str, Any] | None:
        found = self.get("job", job, namespace)
        for condition in (found or {}).get("status", {}).get("conditions") or []:
            if condition["type"] == kind and condition["status"] == "True":
                return condition
        return None

    def finished(self, namespace: str, job: str, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until the Job is Complete or Failed; the Job, as the API has it then."""

        def done() -> dict[str, Any] | None:
            for kind in ("Complete", "Failed"):
                if self.job_condition(namespace, job, kind):
                    return self.get("job", job, namespace)
            return None

        return eventually(done, timeout, f"job {namespace}/{job} finished")


def pod_condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next(
        (c for c in pod.get("status", {}).get("conditions") or [] if c["type"] == kind), None
    )


def job_manifest(
    name: str,
    namespace: str,
    annotations: dict[str, str] | None = None,
    pod_annotations: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
    pod_spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A plain Job as a user writes it: one container, ``restartPolicy: Never``."""
    template_spec = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "main",
                "image": "registry.example/trainer:1",
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
            }
        ],
        **(pod_spec or {}),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
        "spec": {
            "template": {
                "metadata": {"annotations": pod_annotations or {}},
                "spec": template_spec,
            },
            **(spec or {}),
        },
    }


@dataclass
class Served:
    """Our server, started as deployed (``retry-webhook serve``, every worker answering)
    against the cluster, on the port the release's webhooks call."""

    release: Release
    preexec: Callable | None = None
    server: servers.Server | None = None
    identity: str = "cluster-tests"

    def start(self, *extra: str, workers: int = 2) -> servers.Server:
        assert self.server is None or self.server.proc.poll() is not None, "already serving"
        cert_dir = self.release.cert_dir
        self.server = servers.start(
            cert_dir,
            *self.release.cluster_args(extra),
            workers=workers,
            metrics_port=servers.free_port(),
            log_path=self.release.directory / f"server-{time.time_ns()}.log",
            env=self.release.serve_env(self.identity),
            port=self.release.port,
            preexec_fn=self.preexec,
        )
        return self.server

    def stop(self) -> None:
        if self.server is not None and self.server.proc.poll() is None:
            servers.stop(self.server)

    def reconfigure(self, values: dict[str, Any]) -> servers.Server:
        """The release upgraded with ``values`` (the real helm), and the server restarted
        with what it then says (its config file read back from the ConfigMap)."""
        self.stop()
        self.release.values = values
        self.release.install()
        return self.start()


def evict(kube: Kube, pod: dict[str, Any]) -> None:
    """The Eviction API (``pods/eviction``), as ``kubectl drain`` calls it: the API server
    adds ``DisruptionTarget`` (``EvictionByEvictionAPI``), then deletes the pod."""
    meta = pod["metadata"]
    body = client.V1Eviction(
        metadata=client.V1ObjectMeta(name=meta["name"], namespace=meta["namespace"])
    )
    kube.core().create_namespaced_pod_eviction(meta["name"], meta["namespace"], body)


def running(kube: Kube, namespace: str, job: str, count: int = 1) -> list[dict[str, Any]]:
    """Wait until the Job has ``count`` pods running (the kubelet started them), and
    return the Job's pods, oldest first."""

    def check() -> list[dict[str, Any]] | None:
        pods = kube.pods_of(namespace, job)
        live = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
        return pods if len(live) >= count else None

    return eventually(check, 60, f"{count} running pod(s) of {namespace}/{job}")


def node_of(pod: dict[str, Any]) -> str:
    return pod["spec"]["nodeName"]


def wait_node_ready(kube: Kube, name: str) -> None:
    def ready() -> bool:
        node = kube.get("node", name)
        if node is None:
            return False
        conditions = node.get("status", {}).get("conditions") or []
        up = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        tainted = any(
            t["key"].startswith("node.kubernetes.io/") for t in node["spec"].get("taints") or []
        )
        return up and not tainted

    eventually(ready, 90, f"node {name} Ready and untainted")


def lose_node(kube: Kube, name: str) -> None:
    """The Node object deleted, as a cloud's node lifecycle does with a machine that is
    gone: PodGC then fails its pods (``DeletionByPodGC``) after its quarantine."""
    kube.kubectl("delete", "node", name, "--wait=false")


def restore_node(kube: Kube, name: str) -> None:
    """The Node registered again (``Cluster.register_nodes``) and Ready."""
    kube.cluster.register_nodes()
    wait_node_ready(kube, name)


def stop_kubelet(kube: Kube, name: str, stopped: bool = True) -> None:
    """The Node's kubelet lost (``nodes.STOPPED``): no heartbeat, its pods left alone."""
    key = "kubelet.retry-policy.dev/stopped"
    kube.kubectl("annotate", "node", name, "--overwrite", f"{key}=true" if stopped else f"{key}-")


class PodWatch:
    """Every version of every pod of a namespace, as a watch delivers them, collected in
    the background: what a test asserts about a pod that the controllers delete soon."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.seen: list[dict[str, Any]] = []
        self._stop = False
        self._thread: Any = None

    def __enter__(self) -> PodWatch:
        core = self.kube.core()
        started = threading.Event()

        def run() -> None:
            while not self._stop:
                stream = watch.Watch().stream(
                    core.list_namespaced_pod, self.namespace, timeout_seconds=5
                )
                started.set()
                for event in stream:
                    self.seen.append(event["raw_object"])
                    if self._stop:
                        break

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        started.wait(10)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop = True

    def condition(self, uid: str, kind: str) -> dict[str, Any] | None:
        """The condition ``kind`` on any version of the pod ``uid`` seen so far."""
        for pod in self.seen:
            if pod["metadata"]["uid"] == uid:
                found = pod_condition(pod, kind)
                if found is not None and found["status"] == "True":
                    return found
        return None


def as_played(condition: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A real ``DisruptionTarget`` and the one testkit's played disruptors
    (``jobsim._disruption``) write for its reason, on what both say: the fast tier's
    fakes held to the real components."""
    from testkit.jobsim import _disruption

    keys = ("type", "status", "reason", "message")
    played = _disruption(condition["reason"])
    return {k: condition.get(k) for k in keys}, {k: played.get(k) for k in keys}
