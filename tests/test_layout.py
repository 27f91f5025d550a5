"""The package's layout rules, held by reading the code (docs/architecture.md draws them):

* layers point one way: a module imports only from its own layer or the layers below it;
* Dagster is imported only by `dagster/` (and lazily by the CLI, which starts the UI);
* no import cycle between modules;
* a function-local import of the package's own modules is the exception (laziness), not the habit.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "spica_pipeline"

# bottom to top; a module may import its own layer and those below
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "storage", "traces", "progress", "jsonvalue"),
    ("config",),
    ("space",),
    ("fidelity",),
    ("evaluate",),
    ("optimize",),
    ("report",),
    ("sweep", "calibrate", "preflight"),
    ("cli", "dagster", "__main__", "__init__"),
)
MAX_LOCAL_OWN_IMPORTS = 15


def _layer(part: str) -> int:
    for level, names in enumerate(LAYERS):
        if part in names:
            return level
    raise AssertionError(f"spica_pipeline.{part} belongs to no layer: add it to LAYERS (tests/test_layout.py)")


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _package_of(path: Path) -> tuple[str, ...]:
    return path.relative_to(ROOT).with_suffix("").parts[:-1]


def imports(source: str, package: tuple[str, ...]) -> list[tuple[int, str, bool]]:
    """(line, module, at module level) of every import in `source`, at any depth; relative imports are
    resolved against `package`; `from x import y` yields both x and x.y (y may be a module)."""
    tree = ast.parse(source)
    top = {id(n) for n in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` blocks count as module level, they never run
        if isinstance(node, ast.If):
            top |= {id(n) for n in node.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package[:len(package) - node.level + 1] if node.level else ()
            base = ".".join(parts + ((node.module,) if node.module else ()))
            found.append((node.lineno, base, id(node) in top))
            found += [(node.lineno, f"{base}.{alias.name}", id(node) in top) for alias in node.names]
    return found


def _own(name: str) -> list[str] | None:
    parts = name.split(".")
    return parts[1:] if parts[0] == "spica_pipeline" and len(parts) > 1 else None


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down_the_layers(path):
    rel = path.relative_to(PACKAGE).with_suffix("").parts
    mine = _layer(rel[0])
    up = []
    for line, name, _ in imports(path.read_text(), _package_of(path)):
        own = _own(name)
        if own is None:
            if name.split(".")[0] == "dagster" and rel[0] not in ("dagster", "cli"):
                up.append(f"line {line}: {name} (only dagster/ and the CLI import Dagster)")
            continue
        if (ROOT / "spica_pipeline" / own[0]).with_suffix(".py").exists() or (PACKAGE / own[0]).is_dir():
            if _layer(own[0]) > mine:
                up.append(f"line {line}: {name} (layer {_layer(own[0])} above {mine})")
    assert not up


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycles_between_modules():
    names = {_module_name(p): p for p in _modules()}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        found = imports(path.read_text(), _package_of(path))
        # `from package import module` needs the module, not what the package's __init__ imports
        via = {n.rpartition(".")[0] for _, n, top in found if top and n in names}
        graph[name] = {n for _, n, top in found if top and n in names and n != name
                       and not (n in via and f"{n}.__init__" not in names and _only_modules(found, n, names))}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]) if nxt in trail else nxt)
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles


def _only_modules(found: list[tuple[int, str, bool]], package: str, names: dict[str, Path]) -> bool:
    """Whether every `from package import x` of a module names a submodule."""
    lines = {line for line, n, _ in found if n == package}
    return all(n in names for line, n, _ in found if line in lines and n.startswith(package + "."))


def test_function_local_imports_of_our_own_modules_are_few():
    local = [f"{path.relative_to(ROOT)}:{line} {name}" for path in _modules()
             for line, name, top in imports(path.read_text(), _package_of(path))
             if not top and _own(name) is not None and "." not in name.split("spica_pipeline.", 1)[1][:0]]
    # `from x import y` is listed twice (x and x.y): count statements, not names
    statements = {entry.split(" ")[0] for entry in local}
    assert len(statements) <= MAX_LOCAL_OWN_IMPORTS, "\n".join(sorted(statements))


def test_the_check_sees_lazy_relative_and_upward_imports():
    source = "import x\ndef f():\n    import dagster as dg\n    from ..report import tables\n    from . import scoring\n"
    found = imports(source, ("spica_pipeline", "evaluate"))
    assert (3, "dagster", False) in found and (4, "spica_pipeline.report.tables", False) in found
    assert (5, "spica_pipeline.evaluate.scoring", False) in found and (1, "x", True) in found
