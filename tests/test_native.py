"""The compiled modules: used exactly when built from these sources, never when stale."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sysconfig

import pytest

import webhook


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
