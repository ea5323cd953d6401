"""A real control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler built from upstream (``cluster/build``), fake Nodes kept alive by the
played kubelet, in one directory (``.cluster/`` for ``make cluster``, a temporary one for
the cluster tests).

``Cluster.up`` starts it all and waits until it is usable: the API server ready, every
Node Ready, and the ``default`` ServiceAccount made (pods can be created). What it started
is written to ``state.json``, so that ``Cluster.load(directory).down()`` stops it from
another process (``make cluster-down``).
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from testkit.controlplane import components as cp
from testkit.controlplane import pki as pkis
from testkit.controlplane.nodes import DEFAULT_NODES, NodeSpec, node_object, node_status

ROOT, KCP, JOBSET, BUILD = cp.ROOT, cp.KCP, cp.JOBSET, cp.BUILD

#: The ports ``make cluster`` uses (a test cluster takes free ones).
DEFAULT_PORTS = cp.Ports(etcd=2379, etcd_peer=2380, apiserver=6443)


def free_ports() -> cp.Ports:
    from testkit.servers import free_port

    return cp.Ports(etcd=free_port(), etcd_peer=free_port(), apiserver=free_port())


def build() -> Path:
    """``cluster/build``: reuses the binary while its inputs are unchanged."""
    subprocess.run([str(BUILD)], check=True)
    return KCP


@dataclass
class Cluster:
    directory: Path
    ports: cp.Ports = DEFAULT_PORTS
    timing: cp.Timing = field(default_factory=cp.Timing)
    nodes: list[NodeSpec] = field(default_factory=lambda: list(DEFAULT_NODES))
    #: Process name -> pid, of what this cluster started.
    pids: dict[str, int] = field(default_factory=dict)
    started_at: float = 0.0

    @property
    def pki(self) -> pkis.PKI:
        return pkis.PKI(self.directory / "pki")

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig (``make cluster`` copies it to ``.cluster/kubeconfig``)."""
        return self.pki.kubeconfig("admin")

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    def log(self, name: str) -> Path:
        return self.directory / "logs" / f"{name}.log"

    # --- start and stop --------------------------------------------------------------

    def up(self, preexec: Callable | None = None, deadline_seconds: float = 120.0) -> None:
        """Start everything and wait until a pod can be created and run. On failure,
        everything started so far is stopped, and the error carries the log's end."""
        began = time.monotonic()
        deadline = began + deadline_seconds
        kcp = build()
        # A fresh cluster each time: its data was written under the old certificates.
        for old in ("etcd", "logs", "webhook"):
            shutil.rmtree(self.directory / old, ignore_errors=True)
        pkis.create(self.pki.directory, self.server)
        try:
            self._start("etcd", [str(kcp), *cp.etcd_args(self.directory, self.ports)], preexec)
            cp.wait_http(
                f"http://127.0.0.1:{self.ports.etcd}/health", deadline, "etcd", log=self.log("etcd")
            )
            self._start(
                "kube-apiserver", [str(kcp), *cp.apiserver_args(self.pki, self.ports)], preexec
            )
            cp.wait_http(
                f"{self.server}/readyz",
                deadline,
                "kube-apiserver",
                log=self.log("kube-apiserver"),
                context=cp.client_context(self.pki),
            )
            argv = [str(kcp), *cp.controller_manager_args(self.pki, self.timing)]
            self._start("kube-controller-manager", argv, preexec)
            self._start("kube-scheduler", [str(kcp), *cp.scheduler_args(self.pki)], preexec)
            self.start_jobset(preexec)
            self.register_nodes()
            kubelet = [
                sys.executable,
                "-m",
                "testkit.controlplane.kubelet",
                f"--kubeconfig={self.pki.kubeconfig('kubelet')}",
                *(node.name for node in self.nodes),
            ]
            self._start("kubelet", kubelet, preexec, env={"PYTHONPATH": str(ROOT)})
            self.wait_usable(deadline)
        except BaseException:
            self.down()
            raise
        self.started_at = time.time()
        self.save()

    def _start(self, name: str, argv: list[str], preexec, env: dict | None = None) -> None:
        for which, pid in self.pids.items():
            if not cp.alive(pid):
                raise RuntimeError(f"{which} exited; its log ends:\n{self.tail(which)}")
        proc = cp.spawn(argv, self.log(name), env=env, preexec=preexec)
        self.pids[name] = proc.pid
        self.save()

    def down(self) -> None:
        """Stop every process this cluster started, the last started first."""
        for name in reversed(list(self.pids)):
            cp.stop_pid(self.pids[name])
        self.pids.clear()
        self.save()

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.log(name)
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def dead(self) -> list[str]:
        return [name for name, pid in self.pids.items() if not cp.alive(pid)]

    # --- state ------------------------------------------------------------------------

    def save(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        state = {
            "ports": asdict(self.ports),
            "timing": asdict(self.timing),
            "nodes": [asdict(node) for node in self.nodes],
            "pids": self.pids,
            "started_at": self.started_at,
        }
        (self.directory / "state.json").write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> Cluster:
        state = json.loads((directory / "state.json").read_text())
        return cls(
            directory,
            cp.Ports(**state["ports"]),
            cp.Timing(**state["timing"]),
            [NodeSpec(**node) for node in state["nodes"]],
            {name: int(pid) for name, pid in state["pids"].items()},
            state.get("started_at", 0.0),
        )

    # --- the API ----------------------------------------------------------------------

    def api_client(self, who: str = "admin"):
        return config.new_client_from_config(config_file=str(self.pki.kubeconfig(who)))

    def start_jobset(self, preexec: Callable | None = None) -> None:
        """The JobSet controller (``testkit.controlplane.jobset``): its CRD established
        first, then the controller, serving its webhooks, registered once they answer."""
        from testkit.controlplane import jobset
        from testkit.servers import free_port

        definition = jobset.crd()
        extensions = client.ApiextensionsV1Api(self.api_client())
        try:
            extensions.create_custom_resource_definition(definition)
        except ApiException as err:
            if err.status != 409:
                raise
        name = definition["metadata"]["name"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = extensions.read_custom_resource_definition(name)
            conditions = found.status.conditions or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            time.sleep(0.2)
        cert_dir = jobset.serving_certs(self.directory / "jobset-certs")
        port = free_port()
        argv = [
            str(JOBSET),
            f"--kubeconfig={self.pki.kubeconfig('jobset')}",
            f"--webhook-port={port}",
            f"--cert-dir={cert_dir}",
        ]
        self._start("jobset-controller", argv, preexec)
        url = f"https://127.0.0.1:{port}"
        context = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
        cp.wait_until_listening(url, time.monotonic() + 60, self.log("jobset-controller"), context)
        registration = client.AdmissionregistrationV1Api(self.api_client())
        for hooks in jobset.webhook_configurations(url, (cert_dir / "ca.crt").read_bytes()):
            create = (
                registration.create_mutating_webhook_configuration
                if hooks["kind"] == "MutatingWebhookConfiguration"
                else registration.create_validating_webhook_configuration
            )
            try:
                create(hooks)
            except ApiException as err:
                if err.status != 409:
                    raise

    def register_nodes(self) -> None:
        """Each Node as a kubelet registers it (``registerWithAPIServer``), then its status
        (``setNodeStatus``)."""
        core = client.CoreV1Api(self.api_client())
        for node in self.nodes:
            try:
                core.create_node(node_object(node))
            except ApiException as err:
                if err.status != 409:
                    raise
            core.patch_node_status(node.name, {"status": node_status(node)})

    def wait_usable(self, deadline: float) -> None:
        """Every Node Ready and without the not-ready taint, and the ``default``
        ServiceAccount made by its controller (the ServiceAccount admission plugin refuses
        pods until it exists)."""
        core = client.CoreV1Api(self.api_client())
        missing: Any = "nothing read yet"
        while time.monotonic() < deadline:
            dead = self.dead()
            if dead:
                raise RuntimeError(f"{dead[0]} exited; its log ends:\n{self.tail(dead[0])}")
            try:
                missing = self._not_usable(core)
            except ApiException as err:
                missing = f"API {err.status}"
            if not missing:
                return
            time.sleep(0.25)
        raise RuntimeError(f"the cluster is not usable in time: {missing}")

    def _not_usable(self, core) -> str:
        for node in core.list_node().items:
            ready = any(
                c.type == "Ready" and c.status == "True" for c in node.status.conditions or []
            )
            tainted = any(t.key == "node.kubernetes.io/not-ready" for t in node.spec.taints or [])
            if not ready or tainted:
                return f"node {node.metadata.name} not ready"
        names = {sa.metadata.name for sa in core.list_namespaced_service_account("default").items}
        return "" if "default" in names else "no default ServiceAccount yet"


def environment() -> dict[str, str]:
    return {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
