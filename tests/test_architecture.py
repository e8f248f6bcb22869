"""The layering docs/architecture.md describes, checked on the source: no
import cycles between the modules of `localserve` (imports inside functions
count too, and so does a module's import of its own package; those under
`if TYPE_CHECKING:` do not run and do not count), and no HTTP in the serving
layer. Which layer may import which is import-linter's contracts
(`[tool.importlinter]` in pyproject.toml, run by `make lint`)."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import localserve

PACKAGE = Path(localserve.__file__).parent


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at `root`."""
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under `if TYPE_CHECKING:`."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                skipped.update(id(n) for statement in node.body for n in ast.walk(statement))
    return skipped


def imported_names(module: str, path: Path, *, runtime_only: bool = True) -> set[str]:
    """Every dotted name `module` imports, anywhere in the file (absolute;
    `from X import y` gives both `X` and `X.y`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_only(tree) if runtime_only else set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([source] if source else []))
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports. A module that
    imports its own package (`from pkg import sibling` names `pkg` too) counts
    like any other import: when `pkg/__init__` imports the module back, that
    is a cycle (it works only while Python has `pkg` half-built)."""
    modules = module_files(root)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in imported_names(module, path):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (first module repeated last), or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def test_the_check_finds_a_cycle_through_an_import_inside_a_function(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from .. import c\n")
    (package / "c.py").write_text(
        "import typing\nif typing.TYPE_CHECKING:\n    import pkg.d\n\ndef g():\n    import pkg.a\n"
    )
    (package / "d.py").write_text("from pkg import a\n")
    cycle = find_cycle(import_graph(package))
    assert cycle is not None and set(cycle) == {"pkg.a", "pkg.sub.b", "pkg.c"}
    (package / "c.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    import pkg.a\n")
    assert find_cycle(import_graph(package)) is None


def test_the_check_finds_a_module_that_imports_its_own_package_back(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg.core import Thing\n")
    (package / "core.py").write_text("from pkg import helpers\n")
    (package / "helpers.py").write_text("")
    cycle = find_cycle(import_graph(package))
    assert cycle is not None and set(cycle) == {"pkg", "pkg.core"}
    (package / "core.py").write_text("from pkg.helpers import x\n")
    assert find_cycle(import_graph(package)) is None


def test_localserve_has_no_import_cycles() -> None:
    cycle = find_cycle(import_graph(PACKAGE))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_serving_layer_imports_no_http() -> None:
    for module, path in module_files(PACKAGE).items():
        if module == "localserve.serving" or module.startswith("localserve.serving."):
            names = imported_names(module, path, runtime_only=False)
            http = sorted(n for n in names if n.split(".")[0] == "aiohttp" or n.startswith("localserve.api"))
            assert not http, f"{module} imports {http}: the serving layer has no HTTP (docs/architecture.md)"
