"""retry-policy-webhook: retry and failure policy for batch and ML workloads, from annotations.

The modules on every admission's path may also exist compiled with mypyc, about a third
faster on a policy run: in a source checkout, ``make compile`` puts them in
``build/compiled/webhook``; the image build compiles them inside the installed package
(``_compiled``). They are used only when they were built from exactly the sources beside
this file (the build records each source's SHA-256), for this Python, and never with
``RPW_PURE_PYTHON=1``; in every other case, and wherever nothing was compiled (no C
compiler), the pure Python modules run, with the same behaviour (CI runs the whole test
suite both ways).
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from pathlib import Path

#: Compiled when a C compiler is available: the modules a policy run spends its time in.
NATIVE_MODULES = (
    "jsondiff",
    "owned",
    "memo",
    "view",
    "intent",
    "podspec",
    "failurepolicy",
    "policy",
    "problems",
    "engine",
    "mutators/job",
    "mutators/pod",
    "mutators/base",
)
#: Where ``make compile`` puts them in a source checkout: apart from the sources.
NATIVE_DIR = Path(__file__).resolve().parent.parent / "build" / "compiled" / "webhook"
#: Where the image build puts them (``.ci/compile-native --installed``, see Dockerfile):
#: inside the installed package. Looked at first.
INSTALLED_NATIVE_DIR = Path(__file__).resolve().parent / "_compiled"
MANIFEST = "manifest.json"


def source_digests() -> dict[str, str]:
    here = Path(__file__).resolve().parent
    return {
        name: hashlib.sha256((here / f"{name}.py").read_bytes()).hexdigest()
        for name in NATIVE_MODULES
    }


def _native_dir() -> Path | None:
    """The compiled modules' directory, if they match these sources exactly."""
    if os.environ.get("RPW_PURE_PYTHON"):
        return None
    for directory in (INSTALLED_NATIVE_DIR, NATIVE_DIR):
        if _built_from_these_sources(directory):
            return directory
    return None


def _built_from_these_sources(directory: Path) -> bool:
    if not (directory / MANIFEST).is_file():
        return False
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    current = manifest.get("ext_suffix") == sysconfig.get_config_var("EXT_SUFFIX")
    return current and manifest.get("sources") == source_digests()


NATIVE = _native_dir()
if NATIVE is not None:
    # Searched first: ``import webhook.policy`` finds the extension module there.
    __path__.insert(0, str(NATIVE))
