"""The compiled modules: used exactly when built from these sources, never when stale."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import webhook
from benchmarks.cases import streams
from webhook import admission, engine
from webhook.config import Config

ROOT = Path(__file__).resolve().parent.parent
MYPYC = Path(sys.executable).parent / "mypyc"


def test_the_compiled_modules_run_when_required_and_not_when_pure():
    names = [name.replace("/", ".") for name in webhook.NATIVE_MODULES]
    modules = [importlib.import_module(f"webhook.{name}") for name in names]
    if os.environ.get("RPW_PURE_PYTHON"):
        assert webhook.NATIVE is None
        assert all(m.__file__.endswith(".py") for m in modules)
    elif os.environ.get("RPW_REQUIRE_NATIVE") and (shutil.which("cc") or shutil.which("gcc")):
        # make test on a machine with a C compiler: compiled, and in use
        assert webhook.NATIVE is not None
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        assert all(m.__file__.endswith(suffix) for m in modules), [m.__file__ for m in modules]
    else:
        pytest.skip("not required: no RPW_REQUIRE_NATIVE, or no C compiler to build with")


@pytest.fixture
def built(tmp_path, monkeypatch):
    monkeypatch.delenv("RPW_PURE_PYTHON", raising=False)
    monkeypatch.setattr(webhook, "NATIVE_DIR", tmp_path)
    manifest = {
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "sources": webhook.source_digests(),
    }
    (tmp_path / webhook.MANIFEST).write_text(json.dumps(manifest))
    return tmp_path, manifest


def test_a_build_from_these_sources_is_used(built):
    directory, _ = built
    assert webhook._native_dir() == directory


def test_a_stale_build_is_not_used(built):
    directory, manifest = built
    manifest["sources"]["policy"] = "0" * 64  # built before policy.py last changed
    (directory / webhook.MANIFEST).write_text(json.dumps(manifest))
    assert webhook._native_dir() is None


def test_a_build_for_another_python_is_not_used(built):
    directory, manifest = built
    manifest["ext_suffix"] = ".cpython-399-x86_64-linux-gnu.so"
    (directory / webhook.MANIFEST).write_text(json.dumps(manifest))
    assert webhook._native_dir() is None


def test_pure_python_can_be_forced(built, monkeypatch):
    monkeypatch.setenv("RPW_PURE_PYTHON", "1")
    assert webhook._native_dir() is None


#: Run by the installed package, with no source checkout on the path: which modules came
#: from where, and the patch of one review.
PROBE = """
import json, sys
import webhook
from webhook import admission, engine, jsondiff
from webhook.config import Config
from webhook.mutators import base
body = open(sys.argv[1], "rb").read()
verdict = engine.mutate(admission.decode(body), Config())
print(json.dumps({
    "package": webhook.__file__,
    "native": str(webhook.NATIVE),
    "compiled": [jsondiff.__file__, base.__file__],
    "python": engine.__file__,
    "patch": verdict.patch,
}))
"""


@pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")) or not MYPYC.exists(),
    reason="needs a C compiler and mypyc",
)
@pytest.mark.skipif(
    bool(os.environ.get("RPW_PURE_PYTHON")), reason="covered by the run with compiled modules"
)
def test_an_installed_package_runs_the_modules_compiled_beside_it(tmp_path: Path) -> None:
    """The mechanism the image build relies on (Dockerfile, which compiles in a second
    virtualenv and copies the result): install the package from what the build context
    holds (.dockerignore), compile it where it was installed (``--installed``), and run it
    with no source checkout around. Two modules are compiled, to keep this quick; the
    others run as Python beside them."""
    context = tmp_path / "context"
    shutil.copytree(
        ROOT / "webhook", context / "webhook", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, context / name)
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, context],
        check=True,
        cwd=tmp_path,
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RPW_PURE_PYTHON", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    compile_native = [sys.executable, ROOT / ".ci" / "compile-native", "--installed"]
    subprocess.run(
        [*compile_native, "--only", "jsondiff", "mutators/base"], check=True, cwd=tmp_path, env=env
    )
    body = streams(1)["job-annotated"][0]
    (tmp_path / "review.json").write_bytes(body)

    def probe() -> dict:
        run = [sys.executable, "-c", PROBE, tmp_path / "review.json"]
        done = subprocess.run(run, check=True, cwd=tmp_path, env=env, capture_output=True)
        return json.loads(done.stdout)

    seen = probe()
    compiled = site / "webhook" / "_compiled"
    assert seen["package"] == str(site / "webhook" / "__init__.py")
    assert seen["native"] == str(compiled)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    assert seen["compiled"] == [
        str(compiled / f"jsondiff{suffix}"),
        str(compiled / "mutators" / f"base{suffix}"),
    ]
    assert seen["python"] == str(site / "webhook" / "engine.py")
    # Compiled as one group: the modules' code is in one shared extension in the package.
    assert (compiled / f"native__mypyc{suffix}").is_file()
    expected = engine.mutate(admission.decode(body), Config()).patch
    assert expected and seen["patch"] == expected

    # Sources changed after the build (a patched file in the image): the build is not used.
    (site / "webhook" / "jsondiff.py").write_text(
        (site / "webhook" / "jsondiff.py").read_text() + "\n# patched\n"
    )
    assert probe()["native"] == "None"
