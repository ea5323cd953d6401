"""Where the repository is, and the real programs the tests run (kubectl, helm)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def tool(name: str) -> str:
    """Path of a real binary (kubectl, helm), the pinned one first; skip when absent unless
    CI requires it."""
    pinned = ROOT / ".tools" / "bin" / name
    found = str(pinned) if pinned.exists() else shutil.which(name)
    if found:
        return found
    if os.environ.get("RPW_REQUIRE_TOOLS") == "1":
        pytest.fail(f"{name} is required (run .ci/get-k8s-tools)")
    pytest.skip(f"{name} not installed (run .ci/get-k8s-tools)")
    raise AssertionError("unreachable")
