"""The package's layout is its architecture: packages by concern, imported one way only.

A module may import its own package and the packages below it in ``LAYERS``; never one
above. That also rules out import circles between modules, which this checks on its own
(a circle inside one package is allowed by the layers but not by the design).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "webhook"

#: From the top down. A module may import from its own layer or any layer below it.
LAYERS = [
    {"cli"},
    {"policytest", "status"},
    {"serving", "explain", "offline"},
    {"admission", "controller"},
    {"mutators"},
    {"cluster", "policy"},
    {"kube", "tls"},
    {"problems"},
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
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
    loose = {
        m for m in _modules() if m.count(".") == 1 and m.split(".")[1] not in {"cli", "problems"}
    }
    packages = {m.split(".")[1] for m in _modules() if m.count(".") >= 1}
    assert loose <= {f"webhook.{p}" for p in packages}, sorted(loose)


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


def test_no_import_circles_between_modules() -> None:
    modules = _modules()
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
    assert not circles, circles


def test_no_import_path_tricks() -> None:
    """Modules are found where they are: no ``__path__`` or ``sys.path`` edits."""
    offenders = [
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*.py")
        if "__path__" in path.read_text() or "sys.path" in path.read_text()
    ]
    assert not offenders, offenders
