"""The JobSet controller in the played cluster (``cluster/jobset``: sigs.k8s.io/jobset's own
reconcilers and webhooks), installed from what its module ships: its CRD
(config/components/crd/bases), and its webhook configurations (config/components/webhook:
``manifests.yaml`` with the kustomize patches that give its pod webhooks their
``objectSelector``), pointed at the controller's address on 127.0.0.1 instead of its Service,
as our own chart's ``webhook.url`` does.
"""

from __future__ import annotations

import base64
import copy
import subprocess
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from testkit.controlplane.components import ROOT
from webhook.tls import certs

MODULE = "sigs.k8s.io/jobset"


def module_dir() -> Path:
    """Where the module ``cluster/jobset`` builds against lies (the Go module cache)."""
    found = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", MODULE],
        cwd=ROOT / "cluster" / "jobset",
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(found.stdout.strip())


def crd() -> dict[str, Any]:
    path = module_dir() / "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
    return yaml.safe_load(path.read_text())


def webhook_configurations(url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """JobSet's Mutating- and ValidatingWebhookConfiguration, its patches applied, each
    webhook calling ``url`` + its path, trusting ``ca_pem``."""
    base = module_dir() / "config/components/webhook"
    docs = [d for d in yaml.safe_load_all((base / "manifests.yaml").read_text()) if d]
    patches = {
        "MutatingWebhookConfiguration": base / "patches/mutating-patch.yaml",
        "ValidatingWebhookConfiguration": base / "patches/validating-patch.yaml",
    }
    bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in docs:
        patch = yaml.safe_load(patches[doc["kind"]].read_text())
        doc = jsonpatch.apply_patch(copy.deepcopy(doc), patch)
        doc["metadata"] = {
            "name": f"jobset-{doc['kind'].removesuffix('WebhookConfiguration').lower()}"
        }
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": url.rstrip("/") + path, "caBundle": bundle}
        out.append(doc)
    return out


def serving_certs(directory: Path) -> Path:
    """A CA and a serving certificate for 127.0.0.1 (``tls.crt``, ``tls.key``, ``ca.crt``:
    what controller-runtime's webhook server reads from its CertDir)."""
    if not (directory / certs.TLS_CERT).exists():
        certs.generate(directory)
    return directory
