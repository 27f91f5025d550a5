"""The layout rule of the charter that a test can hold: search/ is pure domain logic, so no module
under it imports Dagster or the resources (the replay, Vizier, pools), not even inside a function."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEARCH = ROOT / "spica_pipeline" / "search"
FORBIDDEN = ("dagster", "spica_pipeline.resources", "spica_pipeline.assets")


def imported_modules(source: str, package: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, module) of every import in `source`, at any depth; relative imports are resolved
    against `package` (the importing module's package, e.g. ("spica_pipeline", "search"))."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package[:len(package) - node.level + 1] if node.level else ()
            base = ".".join(parts + ((node.module,) if node.module else ()))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _forbidden(names: list[tuple[int, str]]) -> list[str]:
    return [f"line {line}: {name}" for line, name in names
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)]


@pytest.mark.parametrize("path", sorted(SEARCH.rglob("*.py")), ids=lambda p: str(p.relative_to(SEARCH)))
def test_search_imports_neither_dagster_nor_the_resources(path):
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    assert not _forbidden(imported_modules(path.read_text(), package))


def test_the_check_sees_lazy_and_relative_imports():
    source = "def f():\n    import dagster as dg\n    from ..resources import replay\n    from . import scoring\n"
    bad = _forbidden(imported_modules(source, ("spica_pipeline", "search")))
    assert bad == ["line 2: dagster", "line 3: spica_pipeline.resources", "line 3: spica_pipeline.resources.replay"]
