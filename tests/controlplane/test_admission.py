"""Admission through the real API server: every shipped example applied with the real
kubectl, a denial, a server-side dry run, reinvocation, and the chart's failurePolicy with
our server stopped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.controlplane import crds as crds_module
from testkit.controlplane.harness import Kube, Served, eventually, job_manifest
from testkit.tools import ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def crds(kube: Kube) -> None:
    """The CRDs of the kinds we handle (testkit.controlplane.crds), so that the real API
    server serves them; no controller of theirs runs."""
    # The JobSet CRD is the real one, which the cluster installs with the JobSet controller.
    definitions = [
        crd for crd in crds_module.definitions() if kube.get("crd", crd["metadata"]["name"]) is None
    ]
    kube.apply(yaml.safe_dump_all(definitions), "--server-side")
    for crd in definitions:
        name = crd["metadata"]["name"]
        kube.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")


def in_namespace(path: Path, namespace: str) -> list[dict]:
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
    return docs


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_is_admitted_through_kubectl_as_dry_run_says(
    kube: Kube, webhook: Served, crds: None, ns: str, example: Path, tmp_path: Path
):
    """Through the real kubectl and API server, each shipped example gets our warnings
    and is stored with every change the offline engine (``dry-run -o patch``) makes."""
    docs = in_namespace(example, ns)
    manifest = tmp_path / example.name
    manifest.write_text(yaml.safe_dump_all(docs))
    done = kube.kubectl("apply", "-f", str(manifest))
    warnings = [line for line in done.stderr.splitlines() if line.startswith("Warning: ")]
    assert any(line.startswith("Warning: retry-policy: ") for line in warnings), done.stderr
    offline = subprocess.run(
        [str(BIN / "retry-webhook"), "dry-run", "-f", str(manifest), "-o", "patch"],
        capture_output=True,
        text=True,
        check=True,
    )
    patches = json.loads(offline.stdout)
    assert any(entry["patch"] for entry in patches), f"{example.name}: nothing changed"
    for entry in patches:
        stored = kube.get(f"{entry['kind'].lower()}", entry["name"], ns)
        for op in entry["patch"]:
            found, value = pointer(stored, op["path"])
            if op["op"] == "remove":
                assert not found, op
            else:
                assert found and contains(value, op["value"]), (op, value)


def pointer(obj: Any, path: str) -> tuple[bool, Any]:
    """RFC 6901: (present, value) of ``path`` in ``obj``."""
    for part in path.split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(obj, list) and key.isdigit() and int(key) < len(obj):
            obj = obj[int(key)]
        elif isinstance(obj, dict) and key in obj:
            obj = obj[key]
        else:
            return False, None
    return True, obj


def contains(stored: Any, wanted: Any) -> bool:
    """``stored`` holds ``wanted``: the same scalars and lists, and every key of a wanted
    mapping (the API server may add defaults beside them)."""
    if isinstance(wanted, dict):
        return isinstance(stored, dict) and all(
            key in stored and contains(stored[key], value) for key, value in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(wanted)
            and all(contains(a, b) for a, b in zip(stored, wanted, strict=True))
        )
    return stored == wanted


def test_an_invalid_policy_is_denied_with_our_message(kube: Kube, webhook: Served, ns: str):
    job = job_manifest("bad", ns, {"retry-policy.dev/backoff-limit": "many"})
    done = kube.apply(job, check=False)
    assert done.returncode != 0
    assert 'admission webhook "workloads.' in done.stderr
    assert "denied the request" in done.stderr
    assert "retry-policy.dev/backoff-limit" in done.stderr and "many" in done.stderr
    assert kube.get("job", "bad", ns) is None


def test_a_server_side_dry_run_shows_the_mutation_and_creates_nothing(
    kube: Kube, webhook: Served, ns: str
):
    job = job_manifest(
        "dry",
        ns,
        {"retry-policy.dev/backoff-limit": "2", "retry-policy.dev/fail-non-retriable": "true"},
    )
    done = kube.apply(job, "--dry-run=server", "-o", "json")
    shown = json.loads(done.stdout)
    assert shown["spec"]["backoffLimit"] == 2
    rules = shown["spec"]["podFailurePolicy"]["rules"]
    assert any(rule["action"] == "FailJob" for rule in rules)
    assert "Warning: retry-policy" in done.stderr
    assert kube.get("job", "dry", ns) is None


def test_applying_twice_changes_nothing_the_second_time(kube: Kube, webhook: Served, ns: str):
    job = job_manifest(
        "twice",
        ns,
        {"retry-policy.dev/backoff-limit": "2", "retry-policy.dev/fail-non-retriable": "true"},
        pod_annotations={"kubelet.retry-policy.dev/exit-code": "run"},
    )
    kube.apply(job)
    first = kube.get("job", "twice", ns)
    again = kube.apply(job)
    assert "unchanged" in again.stdout, again.stdout
    assert (
        kube.get("job", "twice", ns)["metadata"]["resourceVersion"]
        == (first["metadata"]["resourceVersion"])
    )


def test_with_our_server_down_the_charts_failure_policies_hold(kube: Kube, served: Served, ns: str):
    """docs/INSTALL.md, "Choosing failurePolicy": the mutating webhook fails open, the
    validating one closed; an object without our annotations is never sent at all."""
    served.stop()
    try:
        plain = job_manifest("plain", ns, pod_annotations={})
        assert kube.apply(plain).returncode == 0
        annotated = job_manifest("annotated", ns, {"retry-policy.dev/backoff-limit": "2"})
        done = kube.apply(annotated, check=False)
        assert done.returncode != 0
        assert "failed calling webhook" in done.stderr
        assert "validate.retry-policy.dev" in done.stderr
        assert kube.get("job", "annotated", ns) is None
    finally:
        served.start()
    eventually(lambda: kube.apply(annotated, check=False).returncode == 0, 30, "admitted again")
    assert kube.get("job", "annotated", ns)["spec"]["backoffLimit"] == 2
