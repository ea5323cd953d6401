"""The suite's fixtures and hooks: the environment every test runs in, the fast tier found
from the code, a smaller hypothesis profile, and nothing left running or left behind.

The builders, the HTTP Kubernetes API, the played Job controller and kubelet, the server
helpers and the RBAC and admission-policy checks are in ``testkit/``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# Every test, and every server a test starts, runs the mutators that read a view of the
# object (``webhook.kinds.view``) on the whole object too, and fails on any difference.
os.environ.setdefault("RPW_CHECK_VIEWS", "1")

from testkit import servers
from testkit.chart import helm  # noqa: F401 (a fixture for every module: helm, once a session)
from testkit.clusters import cluster  # noqa: F401 (a fixture: the test API, Nodes, kubeconfig)
from testkit.tools import ROOT
from webhook.policy.config import Config

# The pinned kubectl and helm (``make tools``) before whatever else is on PATH, for the
# tests and for every process they start (``kubectl retry-policy``'s plugin discovery).
if (ROOT / ".tools" / "bin").is_dir():
    os.environ["PATH"] = os.pathsep.join([str(ROOT / ".tools" / "bin"), os.environ["PATH"]])
# What this pytest process started carries its pid (``pytest_sessionfinish`` looks for
# what is left of it). Set, not inherited: each xdist worker owns what it starts.
OWNER_ENV = "RPW_TEST_OWNER"
os.environ[OWNER_ENV] = str(os.getpid())


@pytest.fixture
def config() -> Config:
    return Config()


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
# functions of tests/, testkit/ and benchmarks/: a new server test is classified without anyone
# remembering. ``@pytest.mark.slow`` marks the rest (waits on the clock); ``fast``
# (``@pytest.mark.fast``) overrides the finding for a test that reaches a program only
# on a path it does not take.


def _slow_entry_points() -> set[int]:
    import subprocess

    calls = [servers.start, servers.run_serve, subprocess.run, subprocess.Popen]
    calls += [subprocess.check_output, subprocess.check_call, subprocess.call]
    return {id(call) for call in calls}


_OURS = (str(ROOT / "tests"), str(ROOT / "testkit"), str(ROOT / "benchmarks"))
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
    servers.IN_FAST_TEST = item.get_closest_marker("slow") is None


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


# --- nothing left running, nothing left behind ------------------------------------------

#: The servers' metrics directories in ``$TMPDIR`` when this process started
#: (``webhook.serving.metricsdir``): another run's, never this one's leftovers.
_DIRS_BEFORE = set(Path(tempfile.gettempdir()).glob("retry-webhook-metrics-*"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Every process this pytest process started (servers, their workers, controllers and
    metrics processes, programs) must be gone by the end: those left are waited for a
    little, then killed, and fail the run. Nor may a server it started leave its metrics
    directory behind in ``$TMPDIR`` (``_left_behind``)."""
    if session.config.getoption("dist", "no") != "no" and not hasattr(
        session.config, "workerinput"
    ):
        return  # an xdist controller: its workers started whatever ran
    _nothing_left_running(session)
    _nothing_left_behind(session)


def _nothing_left_running(session: pytest.Session) -> None:
    import signal
    import time

    mine = str(os.getpid())
    deadline = time.monotonic() + servers.scaled(10)
    left = [pid for pid in servers.marked(mine, OWNER_ENV) if pid != os.getpid()]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [pid for pid in servers.marked(mine, OWNER_ENV) if pid != os.getpid()]
    if not left:
        return
    described = [f"{pid}: {servers.command(pid)}" for pid in left]
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


def _nothing_left_behind(session: pytest.Session) -> None:
    """The metrics directories of servers this process started and that are gone: a
    server stopped removes its own, one killed leaves it to the next start in the same
    ``$TMPDIR`` (``metricsdir.remove_dead_dirs``), so a test that kills one and starts
    none after it must remove it (``servers.remove_metrics_dir``). Those left are
    removed, and fail the run."""
    import shutil

    from webhook.serving import metricsdir

    left = [
        path
        for path in sorted(Path(tempfile.gettempdir()).glob(metricsdir.DIR_PREFIX + "*"))
        if path not in _DIRS_BEFORE
        and (metricsdir.owner(path) or {}).get("parent") == os.getpid()
        and metricsdir.dead(path)
    ]
    if not left:
        return
    for path in left:
        shutil.rmtree(path, ignore_errors=True)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        reporter.write_sep("=", "metrics directories the tests left behind (now removed)", red=True)
        for path in left:
            reporter.write_line(str(path))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- the fast tier stays fast -------------------------------------------------------------

#: A test outside ``slow`` that takes longer than this (scaled) is named at the end.
FAST_SECONDS = 2.0
_slow_unmarked: list[tuple[str, float]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # (Property tests are as long as their profile makes them: ``dev`` for a short loop.)
    if report.when == "call" and not {"slow", "hypothesis"} & set(report.keywords):
        if report.duration > servers.scaled(FAST_SECONDS):
            _slow_unmarked.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _slow_unmarked:
        title = f"not marked slow, yet over {FAST_SECONDS:g} s"
        terminalreporter.write_sep("=", title, yellow=True)
        for nodeid, duration in sorted(_slow_unmarked, key=lambda pair: -pair[1]):
            terminalreporter.write_line(f"{duration:6.2f}s {nodeid}  (@pytest.mark.slow?)")
