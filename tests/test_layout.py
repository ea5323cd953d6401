"""The package's layout is its architecture: packages by concern, imported one way only.

A module may import its own package and the packages below it in ``LAYERS``; never one
above. That also rules out import circles between modules, which this checks on its own
(a circle inside one package is allowed by the layers but not by the design). And it
holds the size rule, for the package and ``testkit/``: no module over 800 lines, no
function over 120 (``KNOWN_OVERSIZE``: what is still to be split).

Beside the package, the tools stand in ``TOOLS``, above it: the benchmarks, then the
tests' kit (``testkit/``). Each imports the package (any layer) and the tools under it,
never the tests; the tests import the kit, never each other or ``conftest``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "webhook"
TESTS = ROOT / "tests"

#: The size rule (issue 40): rooms a person can live in.
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 120
#: What is over the size rule today, due to be split: modules by path, functions as
#: ``path::qualified.name``. This list may only shrink (now empty): the size test fails on
#: anything over the rule that is not listed, and on a listed entry no longer over it.
KNOWN_OVERSIZE: set[str] = set()

#: From the top down. A module may import from its own layer or any layer below it.
LAYERS = [
    {"cli"},
    {"policytest", "status"},
    {"serving", "explain", "offline"},
    {"admission", "controller"},
    {"kinds"},
    {"plan"},
    {"cluster", "policy"},
    {"kube", "tls"},
    {"problems"},
]
#: Beside the package, from the top down: each may import ``webhook`` and the tools under it.
TOOLS = [
    {"benchmarks"},
    {"testkit"},
]


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports (``from webhook.x import y`` counts
    ``webhook.x.y`` when that is a module, else ``webhook.x``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module in modules:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                out.add(child if child in modules else node.module)
    return out


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for index, layer in enumerate(LAYERS):
        if top in layer:
            return index
    raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS")


def test_every_module_sits_in_a_package_by_concern() -> None:
    loose = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__", "problems"}
    assert not loose, sorted(loose)


def test_no_module_imports_a_layer_above_its_own() -> None:
    modules = _modules()
    upward = []
    for name, path in modules.items():
        if name == "webhook":
            continue
        for imported in _imports(path, modules):
            if imported != "webhook" and _layer(imported) < _layer(name):
                upward.append(f"{name} -> {imported}")
    assert not upward, upward


def _circles(modules: dict[str, Path]) -> list[list[str]]:
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    # A package's __init__ and its own modules may name each other (re-exports).
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue
            if state.get(nxt) == 1:
                circles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return circles


#: What ``status`` never imports (issue 40): it tells the stored object from its applied
#: record; re-admission (a version-1 record's fallback) and reading recorded files come
#: from the layer above (``webhook.cli``), which hands them in.
STATUS_NEVER = ("webhook.admission", "webhook.offline", "webhook.controller")


def test_status_imports_neither_admission_offline_nor_the_controller() -> None:
    modules = _modules()
    wrong = [
        f"{name} -> {imported}"
        for name, path in modules.items()
        if name == "webhook.status" or name.startswith("webhook.status.")
        for imported in _imports(path, modules)
        if any(imported == never or imported.startswith(never + ".") for never in STATUS_NEVER)
    ]
    assert not wrong, wrong


def test_no_import_circles_between_modules() -> None:
    circles = _circles(_modules())
    assert not circles, circles


def test_no_import_path_tricks() -> None:
    """Modules are found where they are: no ``__path__`` or ``sys.path`` edits, in the
    package or the tools (``python -m benchmarks.run`` and pytest run from the root)."""
    offenders = [
        str(path.relative_to(ROOT))
        for folder in (PACKAGE, *(ROOT / name for layer in TOOLS for name in layer))
        for path in folder.rglob("*.py")
        if "__path__" in path.read_text() or "sys.path" in path.read_text()
    ]
    assert not offenders, offenders


def oversize(root: Path, package: Path) -> dict[str, int]:
    """Every module of ``package`` over ``MAX_MODULE_LINES`` and every function over
    ``MAX_FUNCTION_LINES``, with its lines: modules by path relative to ``root``,
    functions as ``path::qualified.name``."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found[where] = len(text.splitlines())
        for name, lines in _long_functions(ast.parse(text)):
            found[f"{where}::{name}"] = lines
    return found


def _long_functions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """The functions under ``node`` over ``MAX_FUNCTION_LINES``, methods and nested
    functions too, each counted on its own (``outer.inner`` has its own lines, and they
    count in ``outer``'s as well)."""
    for child in ast.iter_child_nodes(node):
        name = prefix
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}."
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and child.end_lineno:
            lines = child.end_lineno - child.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                yield name[:-1], lines
        yield from _long_functions(child, name)


def test_no_module_or_function_is_over_the_size_rule() -> None:
    """The package's, and the tests' kit's: ``testkit/`` is read as often as the code."""
    found = {**oversize(ROOT, PACKAGE), **oversize(ROOT, ROOT / "testkit")}
    unlisted = {name: lines for name, lines in found.items() if name not in KNOWN_OVERSIZE}
    rule = f"{MAX_MODULE_LINES} lines a module, {MAX_FUNCTION_LINES} a function"
    assert not unlisted, f"over {rule}: split them: {unlisted}"
    shrunk = sorted(KNOWN_OVERSIZE - set(found))
    assert not shrunk, f"no longer over the size rule: remove from KNOWN_OVERSIZE: {shrunk}"


def test_the_size_rule_finds_long_modules_and_functions_nested_ones_too(tmp_path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    lines = MAX_FUNCTION_LINES
    (package / "fits.py").write_text("def fits():\n" + "    pass\n" * (lines - 1))
    (package / "held.py").write_text(
        "class Holder:\n    def method(self):\n" + "        pass\n" * lines
    )
    (package / "nested.py").write_text(
        "def outer():\n    def inner():\n" + "        pass\n" * lines + "    return inner\n"
    )
    (package / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert oversize(tmp_path, package) == {
        "pkg/big.py": MAX_MODULE_LINES + 1,
        "pkg/held.py::Holder.method": lines + 1,
        "pkg/nested.py::outer": lines + 3,
        "pkg/nested.py::outer.inner": lines + 1,
    }


# --- the tools beside the package -----------------------------------------------------------


def _tool(name: str) -> int:
    for index, layer in enumerate(TOOLS):
        if name in layer:
            return index
    raise AssertionError(f"{name} is no tool: add it to TOOLS")


def _top_names(path: Path) -> set[str]:
    """The top-level names of what ``path`` imports, at any depth of its code."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


#: What the tests' own modules are imported as (pytest puts tests/ on the path).
TEST_MODULES = {"tests"} | {path.stem for path in TESTS.glob("*.py")}


def _tool_modules() -> dict[str, Path]:
    return {n: p for layer in TOOLS for tool in layer for n, p in _modules(ROOT / tool).items()}


def test_tools_import_the_package_and_the_tools_under_them_never_the_tests() -> None:
    wrong = []
    for name, path in _tool_modules().items():
        own = _tool(name.split(".")[0])
        for imported in _top_names(path):
            if imported in TEST_MODULES:
                wrong.append(f"{name} -> {imported} (a test module)")
            elif any(imported in layer for layer in TOOLS) and _tool(imported) < own:
                wrong.append(f"{name} -> {imported} (a tool above)")
    assert not wrong, wrong


def test_no_import_circles_between_the_tools_modules() -> None:
    circles = _circles(_tool_modules())
    assert not circles, circles


def test_tests_take_shared_helpers_from_testkit() -> None:
    """A test module imports no other test module, ``conftest`` included: what tests share
    is in ``testkit/`` (fixtures and hooks stay in conftest.py, which pytest loads)."""
    wrong = [
        f"{path.name} -> {imported}"
        for path in sorted(TESTS.glob("*.py"))
        for imported in _top_names(path) & TEST_MODULES
    ]
    assert not wrong, wrong
