"""The dry-run CLI: same engine, API defaults first, exit codes for pipelines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testkit.cli import JOB, run
from testkit.servers import scaled
from testkit.tools import ROOT

BIN = Path(sys.executable).parent / "retry-webhook"


def test_example_dry_run_end_to_end_as_installed():
    result = subprocess.run(
        [str(BIN), "dry-run", "-f", str(ROOT / "examples" / "job.yaml")],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (obj,) = list(yaml.safe_load_all(result.stdout))
    spec = obj["spec"]
    assert spec["backoffLimit"] == 3
    assert spec["podReplacementPolicy"] == "Failed"
    assert [r["action"] for r in spec["podFailurePolicy"]["rules"]] == ["Ignore", "FailJob"]
    assert spec["podFailurePolicy"]["rules"][1]["onExitCodes"]["values"] == [137, 143]
    # API defaults are applied as the server would, and no synthetic record leaks out.
    assert spec["completionMode"] == "NonIndexed"
    assert "kubectl.kubernetes.io/last-applied-configuration" not in obj["metadata"]["annotations"]
    lines = result.stderr.strip().splitlines()
    assert lines and all(line.startswith("Change: retry-policy: ") for line in lines)


def test_stdin_multi_document_with_a_denial():
    text = JOB.format(name="good", limit=2) + "---\n" + JOB.format(name="bad", limit="x")
    code, out, err = run(["dry-run", "-f", "-"], stdin=text)
    assert code == 1
    docs = list(yaml.safe_load_all(out))
    assert [d["metadata"]["name"] for d in docs] == ["good"]
    assert "Error: Job/bad denied: retry-policy: annotation retry-policy.dev/backoff-limit" in err


def test_namespace_flag_and_default():
    code, out, _ = run(
        ["dry-run", "-f", "-", "-n", "research"], stdin=JOB.format(name="a", limit=1)
    )
    assert code == 0 and yaml.safe_load(out)["metadata"]["namespace"] == "research"
    code, out, _ = run(["dry-run", "-f", "-"], stdin=JOB.format(name="a", limit=1))
    assert yaml.safe_load(out)["metadata"]["namespace"] == "default"


def test_namespace_flag_never_overrides_the_manifests_own():
    """As kubectl: an object that names a namespace other than -n's is an error naming
    both (it would be judged against the wrong namespace's defaults); the same is fine."""
    obj = yaml.safe_load(JOB.format(name="a", limit=1))
    obj["metadata"]["namespace"] = "ml"
    text = yaml.safe_dump(obj)
    code, out, err = run(["dry-run", "-f", "-", "-n", "research"], stdin=text)
    assert code == 2 and out.strip() in ("", "null", "...")
    assert "Job/a: its namespace 'ml' does not match -n 'research'" in err
    code, out, _ = run(["dry-run", "-f", "-", "-n", "ml"], stdin=text)
    assert code == 0 and yaml.safe_load(out)["metadata"]["namespace"] == "ml"


def test_output_json_is_a_v1_list():
    code, out, _ = run(["dry-run", "-f", "-", "-o", "json"], stdin=JOB.format(name="a", limit=1))
    assert code == 0
    data = json.loads(out)
    assert data["apiVersion"] == "v1" and data["kind"] == "List"
    assert data["items"][0]["spec"]["backoffLimit"] == 1


def test_output_patch():
    code, out, _ = run(["dry-run", "-f", "-", "-o", "patch"], stdin=JOB.format(name="a", limit=1))
    assert code == 0
    (entry,) = json.loads(out)
    assert entry["kind"] == "Job" and entry["name"] == "a" and entry["namespace"] == "default"
    assert {"op": "replace", "path": "/spec/backoffLimit", "value": 1} in entry["patch"]


def test_json_list_input():
    doc = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [yaml.safe_load(JOB.format(name="a", limit=4))],
    }
    code, out, _ = run(["dry-run", "-f", "-"], stdin=json.dumps(doc))
    assert code == 0 and yaml.safe_load(out)["spec"]["backoffLimit"] == 4


def test_written_six_is_the_users_intent():
    text = JOB.format(name="a", limit=2).replace(
        "spec:\n  template:", "spec:\n  backoffLimit: 6\n  template:"
    )
    code, _, err = run(["dry-run", "-f", "-"], stdin=text)
    assert code == 1
    assert "contradicts spec.backoffLimit: 6" in err


def test_unreadable_inputs_exit_2(tmp_path):
    assert run(["dry-run", "-f", str(tmp_path / "missing.yaml")])[0] == 2
    assert run(["dry-run", "-f", "-"], stdin="a: [unclosed")[0] == 2
    code, _, err = run(["dry-run", "-f", "-"], stdin="just text\n")
    assert code == 2 and "not a Kubernetes object" in err


def test_bad_config_exits_2(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("defaults: {backoff-limit: x}\n")
    code, _, err = run(
        ["dry-run", "-f", "-", "--config", str(config)], stdin=JOB.format(name="a", limit=1)
    )
    assert code == 2 and "defaults.backoff-limit" in err


def test_config_defaults_apply_in_dry_run(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("defaults: {fail-non-retriable: true}\n")
    text = JOB.format(name="a", limit=1)
    code, out, _ = run(["dry-run", "-f", "-", "--config", str(config)], stdin=text)
    assert code == 0
    rules = yaml.safe_load(out)["spec"]["podFailurePolicy"]["rules"]
    assert [rule["action"] for rule in rules] == ["Count", "FailJob"]


def test_unknown_kinds_pass_through_unchanged():
    text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}\n"
    code, out, err = run(["dry-run", "-f", "-"], stdin=text)
    assert code == 0 and err == ""
    assert yaml.safe_load(out) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "default"},
        "data": {"a": "b"},
    }


def test_check_config(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("defaults: {backoff-limit: 2}\n")
    code, out, _ = run(["check-config", str(good)])
    assert code == 0 and "OK (1 cluster defaults" in out
    assert "failure categories: the admins' own: none; the condition is written where" in out
    good.write_text(
        "categoryConditions: Always\n"
        "categories:\n  - {name: BadInput, hint: h, match: {exitCodes: [3]}}\n"
    )
    code, out, _ = run(["check-config", str(good)])
    assert "own: BadInput; the condition is written on every failed pod" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaults: {backoff-limit: -2}\n")
    code, _, err = run(["check-config", str(bad)])
    assert code == 1 and "defaults.backoff-limit" in err


def configmap(name: str, config: str) -> str:
    """A ConfigMap as the chart renders its config (``toYaml`` under ``config.yaml``)."""
    body = yaml.safe_dump({"config.yaml": config}, default_style="|")
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}}}\ndata:\n" + "".join(
        f"  {line}\n" for line in body.splitlines()
    )


def test_check_config_reads_the_charts_configmap_from_stdin():
    other = "---\napiVersion: v1\nkind: Service\nmetadata: {name: svc}\n"
    rendered = configmap("rpw", "defaults:\n  backoff-limit: 2\n") + other
    code, out, _ = run(["check-config", "-"], stdin=rendered)
    assert code == 0 and out.startswith("stdin: ConfigMap rpw: OK (1 cluster defaults")
    code, _, err = run(["check-config", "-"], stdin=configmap("rpw", "defaults: {x: 1}\n"))
    assert code == 1 and "invalid config stdin: ConfigMap rpw" in err
    two = configmap("a", "{}\n") + "---\n" + configmap("b", "{}\n")
    code, _, err = run(["check-config", "-"], stdin=two)
    assert code == 1 and "holds 2 ConfigMaps with a config.yaml: a, b" in err
    code, _, err = run(["check-config", "-"], stdin="")
    assert code == 1 and err == "Error: stdin is empty: nothing to check\n"


def test_certs_command_writes_files(tmp_path):
    code, out, _ = run(["certs", "--cert-dir", str(tmp_path), "--service", "s", "--namespace", "n"])
    assert code == 0 and "tls.key" in out
    assert {p.name for p in tmp_path.iterdir()} == {"ca.crt", "ca.key", "tls.crt", "tls.key"}


def test_version_is_the_package_metadata():
    from importlib import metadata

    wanted = metadata.version("retry-policy-webhook")
    for name, prog in (
        ("retry-webhook", "retry-webhook"),
        ("kubectl-retry_policy", "kubectl retry-policy"),
    ):
        done = subprocess.run(
            [str(Path(sys.executable).parent / name), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0 and done.stdout == f"{prog} {wanted}\n", done


def test_make_dry_run_prints_only_yaml_even_while_it_installs(tmp_path):
    """``make dry-run`` on a fresh clone: the install runs first, and whatever it prints
    (pip, venv, make's own echo of a command) must stay off stdout, which is the YAML.
    The installer here is a stand-in that is noisy on both streams; the CLI is the real
    one."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    noisy = 'echo "noise on stdout: $*"; echo "noise on stderr: $*" >&2\n'
    installer = tmp_path / "python3"
    installer.write_text(
        "#!/bin/sh\n"
        + noisy
        + f'mkdir -p "{venv}/bin"\n'
        + f"printf '#!/bin/sh\\n{noisy.replace(chr(10), '')}\\n' > \"{venv}/bin/python\"\n"
        + f'printf \'#!/bin/sh\\nexec {BIN} "$@"\\n\' > "{venv}/bin/retry-webhook"\n'
        + f'chmod +x "{venv}/bin/python" "{venv}/bin/retry-webhook"\n'
    )
    installer.chmod(0o755)
    # Not a sub-make of whatever runs the tests: make would announce its directory.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(
        [make, "dry-run", f"VENV={venv}", f"PYTHON={installer}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (venv / "bin" / ".installed").exists()  # the install did run
    assert "noise on stderr: -m pip install" in done.stderr
    direct = subprocess.run(
        [str(BIN), "dry-run", "-f", "examples/job.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout == direct.stdout
    assert [d["kind"] for d in yaml.safe_load_all(done.stdout)] == ["Job"]
