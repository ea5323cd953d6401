"""The Helm chart rendered by the real ``helm`` (each values set once a session), and its
manifests picked out by kind and name.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.servers import scaled
from testkit.tools import ROOT

CHART = ROOT / "charts" / "retry-policy-webhook"
RELEASE = "rpw"
NAMESPACE = "rpw-system"
#: The Kubernetes version whose strict schemas rendered objects are validated against.
K8S_VERSION = "1.37"


WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "escalate", "bind"}


def _find_tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    local = ROOT / ".tools" / "bin" / name
    return str(local) if local.is_file() and os.access(local, os.X_OK) else None


@pytest.fixture(scope="session")
def helm() -> str:
    path = _find_tool("helm")
    if path is None:
        message = "helm not found on PATH or in .tools/bin (run .ci/get-k8s-tools)"
        if os.environ.get("RPW_REQUIRE_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def run_helm(helm: str, *args: str, values: dict[str, Any] | None = None):
    with tempfile.TemporaryDirectory() as tmp:
        extra: list[str] = []
        if values is not None:
            path = Path(tmp) / "values.yaml"
            path.write_text(yaml.safe_dump(values), encoding="utf-8")
            extra = ["-f", str(path)]
        return subprocess.run(
            [helm, *args, *extra], capture_output=True, text=True, timeout=scaled(60), check=False
        )


@functools.cache
def _render_cached(helm: str, values_json: str, namespace: str) -> str:
    result = run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        namespace,
        values=json.loads(values_json),
    )
    assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
    return result.stdout


def render(helm: str, values: dict[str, Any], namespace: str = NAMESPACE) -> list[dict]:
    """Rendered manifests (fresh copies: tests may edit them)."""
    text = _render_cached(helm, json.dumps(values, sort_keys=True), namespace)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render_fails(helm: str, values: dict[str, Any], *args: str) -> str:
    result = run_helm(helm, "template", RELEASE, str(CHART), "-n", NAMESPACE, *args, values=values)
    assert result.returncode != 0, f"helm template accepted {values} {args}"
    return result.stderr


def objects(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in objects(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def deployment_pod(docs: list[dict]) -> dict:
    return one(docs, "Deployment")["spec"]["template"]


def hook_events(obj: dict) -> set[str]:
    value = (obj["metadata"].get("annotations") or {}).get("helm.sh/hook", "")
    return {e.strip() for e in value.split(",") if e.strip()}


def webhooks(docs: list[dict], kind: str) -> dict[str, dict]:
    return {w["name"]: w for w in one(docs, kind)["webhooks"]}
