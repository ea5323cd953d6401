"""Shared builders and fixtures.

Fixtures are built here, in code, the way the API server sends them: defaulted objects,
a ``last-applied-configuration`` when the test says the object came from ``kubectl
apply``, and on CREATE no ``uid``, ``creationTimestamp`` or ``resourceVersion``: the create
handler wipes the first two before admission and the store assigns them after
(``rest.WipeObjectMetaSystemFields`` in k8s.io/apiserver pkg/endpoints/handlers/create.go,
``rest.FillObjectMetaSystemFields`` in ``Store.create``), and a client that sends a
``resourceVersion`` is refused by the store. ``managedFields`` *are* there: the same
handler runs ``FieldManager.UpdateNoErrors`` before ``mutatingAdmission.Admit``. A
controller's pod has ``generateName`` and no ``name`` (the name is
generated in ``BeforeCreate``, after admission). Objects that exist already (UPDATE,
DELETE, what a watch delivers) get their system fields from ``stored``. No recorded
documents are copied.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from hypothesis import settings

# Every test, and every server a test starts, runs the mutators that read a view of the
# object (``webhook.kinds.view``) on the whole object too, and fails on any difference.
os.environ.setdefault("RPW_CHECK_VIEWS", "1")

from webhook.kinds import registry as defaults
from webhook.kube.intent import LAST_APPLIED
from webhook.policy.config import Config

ROOT = Path(__file__).resolve().parent.parent
# The pinned kubectl and helm (``make tools``) before whatever else is on PATH, for the
# tests and for every process they start (``kubectl retry-policy``'s plugin discovery).
if (ROOT / ".tools" / "bin").is_dir():
    os.environ["PATH"] = os.pathsep.join([str(ROOT / ".tools" / "bin"), os.environ["PATH"]])
# What this pytest process started carries its pid (``pytest_sessionfinish`` looks for
# what is left of it). Set, not inherited: each xdist worker owns what it starts.
OWNER_ENV = "RPW_TEST_OWNER"
os.environ[OWNER_ENV] = str(os.getpid())
P = "retry-policy.dev/"
#: Every annotation a Job takes at once: the policy most tests start from
#: (error-propagation belongs to PyTorchJobs only: ``podspec.NOT_A_PYTORCHJOB``).
FULL = {
    P + "fail-non-retriable": "true",
    P + "retriable-exit-codes": "137,143",
    P + "backoff-limit": "3",
    P + "ignore-disruptions": "true",
    P + "non-spot-attempts": "1",
}


def job(
    annotations: dict[str, str] | None = None,
    *,
    name: str = "train",
    namespace: str = "ml",
    restart_policy: str = "Never",
    containers: list[dict[str, Any]] | None = None,
    spec: dict[str, Any] | None = None,
    template_annotations: dict[str, str] | None = None,
    applied: bool = False,
    default: bool = True,
) -> dict[str, Any]:
    """A batch/v1 Job as admission sees it: defaulted, and with a last-applied record
    of the manifest when ``applied`` (it came from ``kubectl apply``)."""
    manifest: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": restart_policy,
                    "containers": containers or [{"name": "main", "image": "busybox:1.36"}],
                }
            }
        },
    }
    if annotations:
        manifest["metadata"]["annotations"] = dict(annotations)
    if template_annotations:
        manifest["spec"]["template"]["metadata"] = {"annotations": dict(template_annotations)}
    if spec:
        manifest["spec"].update(copy.deepcopy(spec))
    obj = copy.deepcopy(manifest)
    if applied:
        obj["metadata"].setdefault("annotations", {})[LAST_APPLIED] = json.dumps(manifest)
    if default:
        defaults.apply_defaults(obj)
    return obj


def pod(
    annotations: dict[str, str] | None = None,
    *,
    name: str | None = None,
    namespace: str = "ml",
    owner: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Pod as admission sees it on CREATE: a controller's pod (``owner``) has
    ``generateName`` (the Job controller's is ``<job>-``) and no name; a bare pod has the
    name its author wrote (``name``, default ``train-abcde``)."""
    metadata: dict[str, Any] = {"namespace": namespace}
    if owner and name is None:
        metadata["generateName"] = f"{owner.get('name', 'train')}-"
    else:
        metadata["name"] = name or "train-abcde"
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:1.36"}],
        },
    }
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)
    if owner:
        obj["metadata"]["ownerReferences"] = [owner]
    if spec:
        obj["spec"].update(copy.deepcopy(spec))
    defaults.apply_defaults(obj)
    return obj


def stored(obj: dict[str, Any], *, uid: str | None = None, version: str = "1") -> dict[str, Any]:
    """``obj`` as it is once stored (an UPDATE's objects, a watch event): the system
    fields ``rest.FillObjectMetaSystemFields`` assigns, and a name for a generated one."""
    obj = copy.deepcopy(obj)
    meta = obj.setdefault("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
    meta.setdefault("uid", uid or str(uuid.uuid4()))
    meta.setdefault("resourceVersion", version)
    meta.setdefault("creationTimestamp", "2026-11-22T00:00:00Z")
    return obj


def job_owner(name: str = "train", uid: str = "job-uid-1") -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def review(
    obj: dict[str, Any] | None,
    *,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    uid: str | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """An AdmissionReview request for ``obj`` as the API server sends it. On CREATE the
    object must be shaped as the create handler hands it over (no system fields: see the
    module's doc); a test that needs otherwise builds the review itself."""
    if operation == "CREATE" and obj is not None:
        present = SYSTEM_FIELDS.intersection(obj.get("metadata") or {})
        assert not present, f"a CREATE review's object carries no {sorted(present)}"
    source = obj or old or {}
    api_version = source.get("apiVersion", "v1")
    group, _, version = api_version.rpartition("/")
    kind = source.get("kind", "Pod")
    plural = kind.lower() + "s"
    metadata = source.get("metadata") or {}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": plural},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": plural},
            "name": metadata.get("name", ""),
            "namespace": metadata.get("namespace"),
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


#: What the API server assigns only after admission on CREATE.
SYSTEM_FIELDS = frozenset({"uid", "resourceVersion", "creationTimestamp"})


def leaves(value: Any, path: tuple = ()):
    """Every (path, scalar) of a document; nulls are skipped (null means unset in
    Kubernetes: filling one in loses nothing)."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield from leaves(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from leaves(child, (*path, index))
    elif value is not None:
        yield path, value


def decode_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    body = response["response"]
    if "patch" not in body:
        return []
    assert body["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(body["patch"]))


def apply(obj: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    return jsonpatch.apply_patch(obj, patch) if patch else copy.deepcopy(obj)


@pytest.fixture
def config() -> Config:
    return Config()


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


@pytest.fixture(autouse=True)
def _forget_remembered_verdicts():
    """Each test starts with an empty verdict memo (``webhook.admission.memo``), so a test that
    patches a mutator never sees an answer remembered by another test."""
    from webhook.admission import engine

    engine.MEMO.clear()
    yield


# --- tiers: what is slow, found from the code --------------------------------------------
#
# ``slow``: a test that starts a real server, runs a program (the CLI, kubectl, helm) or
# waits on the clock. Found by what the test and its fixtures can reach among the
# functions of tests/ and benchmarks/: a new server test is classified without anyone
# remembering. ``@pytest.mark.slow`` marks the rest (waits on the clock); ``fast``
# (``@pytest.mark.fast``) overrides the finding for a test that reaches a program only
# on a path it does not take.


def _slow_entry_points() -> set[int]:
    import subprocess

    import serverproc

    calls = [serverproc.start, serverproc.run_serve, subprocess.run, subprocess.Popen]
    calls += [subprocess.check_output, subprocess.check_call, subprocess.call]
    return {id(call) for call in calls}


_OURS = (str(ROOT / "tests"), str(ROOT / "benchmarks"))
_verdicts: dict[tuple[int, int], bool] = {}


def _ours(obj: Any) -> bool:
    code = getattr(obj, "__code__", None)
    return code is not None and code.co_filename.startswith(_OURS)


def _called(code: Any, names: dict[str, Any]) -> Any:
    """What ``code`` loads that it may call: the globals it reads (not attribute names that
    happen to be spelled like one), what it imports, and attributes of modules and classes
    it reads (``subprocess.run``, ``https.Served``)."""
    import dis
    import sys

    last, imported, local = None, None, {}
    for instruction in dis.get_instructions(code):
        op, name = instruction.opname, instruction.argval
        if op in ("STORE_FAST", "STORE_DEREF", "STORE_NAME") and last is not None:
            local[name] = last  # ``import subprocess`` inside a function, say
            last = None
            continue
        if op in ("LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE", "LOAD_FAST_CHECK"):
            last = local.get(name)
        elif op in ("LOAD_GLOBAL", "LOAD_NAME"):
            last = names.get(name)
        elif op == "IMPORT_NAME":
            imported = sys.modules.get(name)  # what a ``from`` takes its names from
            last = sys.modules.get(name.partition(".")[0])  # what ``import a.b`` binds
        elif op == "IMPORT_FROM":
            last = getattr(imported, name, None)
        elif op in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(last, type | type(sys)):
            last = getattr(last, name, None)
        else:
            last = None
            continue
        yield last


def _reaches(code: Any, names: dict[str, Any], slow: set[int]) -> bool:
    """Whether ``code`` (resolving names in ``names``, its globals) can call a slow entry
    point, directly or through our own functions, classes and nested functions."""
    import inspect

    # By identity: equal code objects (the same few lines at the same line of two files)
    # may resolve their names in different globals.
    key = (id(code), id(names))
    if key in _verdicts:
        return _verdicts[key]
    _verdicts[key] = False  # recursion: assume not while looking
    found = False
    for obj in _called(code, names):
        if id(obj) in slow:
            found = True
        elif inspect.isclass(obj):
            found = any(
                _reaches(f.__code__, f.__globals__, slow)
                for f in vars(obj).values()
                if inspect.isfunction(f) and _ours(f)
            )
        elif inspect.isfunction(obj) and _ours(obj):
            found = _reaches(obj.__code__, obj.__globals__, slow)
        if found:
            break
    if not found:
        found = any(
            _reaches(const, names, slow) for const in code.co_consts if inspect.iscode(const)
        )
    _verdicts[key] = found
    return found


def _is_slow(item: pytest.Item, slow: set[int]) -> bool:
    import inspect

    functions = [getattr(item, "obj", None)]
    info = getattr(item, "_fixtureinfo", None)
    for definitions in info.name2fixturedefs.values() if info else []:
        functions += [definition.func for definition in definitions]
    for function in functions:
        function = inspect.unwrap(getattr(function, "__func__", function))
        if inspect.isfunction(function) and _ours(function):
            if _reaches(function.__code__, function.__globals__, slow):
                return True
    return False


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures: a test found fast that starts a server anyway fails."""
    import serverproc

    serverproc.IN_FAST_TEST = item.get_closest_marker("slow") is None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _cap_examples(items)
    slow = _slow_entry_points()
    for item in items:
        if item.get_closest_marker("slow") or item.get_closest_marker("fast"):
            continue
        if _is_slow(item, slow):
            item.add_marker(pytest.mark.slow)


# --- a smaller hypothesis profile for a local loop --------------------------------------
#
# ``ci`` (the default) runs each property test with the examples it asks for;
# ``HYPOTHESIS_PROFILE=dev`` (or ``--hypothesis-profile=dev``) caps them at
# ``DEV_EXAMPLES``, for a contributor's loop. An explicit ``@settings(max_examples=...)``
# outranks any profile, so the cap is put on each test's own settings.
DEV_EXAMPLES = 25
settings.register_profile("ci", settings())
settings.register_profile("dev", settings(max_examples=DEV_EXAMPLES))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _cap_examples(items: list[pytest.Item]) -> None:
    if settings.get_current_profile_name() != "dev":
        return
    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)  # @settings' result
        if own is not None and own.max_examples > DEV_EXAMPLES:
            test._hypothesis_internal_use_settings = settings(own, max_examples=DEV_EXAMPLES)


# --- nothing left running ---------------------------------------------------------------


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Every process this pytest process started (servers, their workers, controllers and
    metrics processes, programs) must be gone by the end: those left are waited for a
    little, then killed, and fail the run."""
    import signal
    import time

    from serverproc import command, marked, scaled

    if session.config.getoption("dist", "no") != "no" and not hasattr(
        session.config, "workerinput"
    ):
        return  # an xdist controller: its workers started whatever ran
    mine = str(os.getpid())
    deadline = time.monotonic() + scaled(10)
    left = [pid for pid in marked(mine, OWNER_ENV) if pid != os.getpid()]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [pid for pid in marked(mine, OWNER_ENV) if pid != os.getpid()]
    if not left:
        return
    described = [f"{pid}: {command(pid)}" for pid in left]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        reporter.write_sep("=", "processes the tests left running (now killed)", red=True)
        for line in described:
            reporter.write_line(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- the fast tier stays fast -------------------------------------------------------------

#: A test outside ``slow`` that takes longer than this (scaled) is named at the end.
FAST_SECONDS = 2.0
_slow_unmarked: list[tuple[str, float]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # (Property tests are as long as their profile makes them: ``dev`` for a short loop.)
    if report.when == "call" and not {"slow", "hypothesis"} & set(report.keywords):
        from serverproc import scaled

        if report.duration > scaled(FAST_SECONDS):
            _slow_unmarked.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _slow_unmarked:
        title = f"not marked slow, yet over {FAST_SECONDS:g} s"
        terminalreporter.write_sep("=", title, yellow=True)
        for nodeid, duration in sorted(_slow_unmarked, key=lambda pair: -pair[1]):
            terminalreporter.write_line(f"{duration:6.2f}s {nodeid}  (@pytest.mark.slow?)")
