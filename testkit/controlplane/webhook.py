"""Our webhook and controller against the real control plane, served from outside the
cluster as a developer runs an admission webhook: ``retry-webhook serve`` on 127.0.0.1,
registered through the chart's own objects (``helm upgrade --install`` with the real helm,
``webhook.url`` pointing at it), and acting with a token of the chart's ServiceAccount, so
that the real API server enforces the chart's RBAC and ValidatingAdmissionPolicy on it.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testkit.controlplane.cluster import ROOT, Cluster
from testkit.controlplane.pki import write_kubeconfig
from webhook.tls import certs

CHART = ROOT / "charts" / "retry-policy-webhook"
RELEASE = "retry-policy-webhook"
NAMESPACE = "retry-policy-system"
#: The chart's controller Lease (``controller.leaseName``).
LEASE = "retry-policy-webhook-controller"


def tool(name: str) -> str:
    local = ROOT / ".tools" / "bin" / name
    return str(local) if local.exists() else name


@dataclass
class Release:
    """One installed release of the chart, served at ``url``."""

    cluster: Cluster
    port: int
    name: str = RELEASE
    namespace: str = NAMESPACE
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def directory(self) -> Path:
        return self.cluster.directory / "webhook" / self.name

    @property
    def cert_dir(self) -> Path:
        return self.directory / "certs"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def token_kubeconfig(self) -> Path:
        return self.directory / "serviceaccount.kubeconfig"

    @property
    def config_file(self) -> Path:
        return self.directory / "config.yaml"

    def kubectl(self, *args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        return run(
            [tool("kubectl"), "--kubeconfig", str(self.cluster.kubeconfig), *args], check, **kwargs
        )

    def install(self) -> None:
        """Certificates for the server (made once), the chart installed or upgraded with
        ``webhook.url``, then what the server needs from it: its config file, read back
        from the chart's ConfigMap, and a kubeconfig with a token of its ServiceAccount."""
        if not (self.cert_dir / certs.TLS_CERT).exists():
            certs.generate(self.cert_dir)
        bundle = base64.b64encode((self.cert_dir / certs.CA_CERT).read_bytes()).decode()
        values = {
            **self.values,
            "webhook": {**self.values.get("webhook", {}), "url": self.url, "caBundle": bundle},
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        values_file = self.directory / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        run(
            [
                tool("helm"),
                "upgrade",
                "--install",
                self.name,
                str(CHART),
                "--namespace",
                self.namespace,
                "--create-namespace",
                "--kubeconfig",
                str(self.cluster.kubeconfig),
                "--values",
                str(values_file),
            ],
            True,
            capture_output=True,
        )
        self.write_config()
        self.write_token()

    def released(self, kind: str) -> list[dict[str, Any]]:
        """The release's objects of ``kind`` in its namespace, as the API has them."""
        selector = f"app.kubernetes.io/instance={self.name}"
        found = self.kubectl(
            "get", kind, "-n", self.namespace, "-o", "json", "-l", selector, capture_output=True
        )
        return json.loads(found.stdout)["items"]

    def write_config(self) -> None:
        items = self.released("configmap")
        data = items[0]["data"]["config.yaml"] if items else "{}\n"
        self.config_file.write_text(data)

    def service_account(self) -> str:
        names = [item["metadata"]["name"] for item in self.released("serviceaccount")]
        assert names, f"the chart made no ServiceAccount in {self.namespace}"
        return sorted(names, key=len)[0]

    def write_token(self, hours: int = 48) -> None:
        """A bound token of the chart's ServiceAccount (the TokenRequest API, as a pod's
        projected token is), in a kubeconfig of its own."""
        token = self.kubectl(
            "create",
            "token",
            self.service_account(),
            "-n",
            self.namespace,
            f"--duration={hours}h",
            capture_output=True,
        ).stdout.strip()
        user = f"system:serviceaccount:{self.namespace}:{self.service_account()}"
        write_kubeconfig(
            self.token_kubeconfig, self.cluster.server, self.cluster.pki.ca, user, {"token": token}
        )

    def serve_args(self, metrics_port: int = 0, extra: tuple[str, ...] = ()) -> list[str]:
        """``retry-webhook serve`` as the chart's Deployment runs it, but on loopback."""
        listen = ["--cert-dir", str(self.cert_dir), "--host", "127.0.0.1"]
        listen += ["--port", str(self.port), "--metrics-port", str(metrics_port)]
        return [*listen, *self.cluster_args(extra)]

    def cluster_args(self, extra: tuple[str, ...] = ()) -> list[str]:
        """What the server takes from the release: its config, the API through the
        token's kubeconfig, its namespace and the controller's Lease."""
        args = ["--config", str(self.config_file), "--kube", "kubeconfig"]
        args += ["--namespace", self.namespace]
        if (self.values.get("controller") or {}).get("enabled", True):
            args += ["--lease-name", LEASE, "--lease-namespace", self.namespace]
        else:
            args.append("--no-controller")
        return [*args, *extra]

    def serve_env(self, identity: str) -> dict[str, str]:
        """The kubeconfig of the token, and the identity the chart's pods take from the
        downward API (``POD_NAME``: the controller's identity on the Lease)."""
        return {
            "KUBECONFIG": str(self.token_kubeconfig),
            "POD_NAME": identity,
            "POD_NAMESPACE": self.namespace,
            "NO_PROXY": "127.0.0.1,localhost",
        }


def run(argv: list[str], check: bool, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("text", True)
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}
    done = subprocess.run(argv, env=env, **kwargs)
    if check and done.returncode != 0:
        said = f"{done.stderr or ''}{done.stdout or ''}"
        raise RuntimeError(f"{' '.join(argv[:3])} ... failed ({done.returncode}): {said}")
    return done
