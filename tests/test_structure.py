"""The package structure: imports run one way. No two modules import each other, however indirectly (imports
inside functions count: they are the same dependency, only hidden), strategies know nothing of the harness, and
the composition root `harness.job` is imported only by entry points."""

import ast
import graphlib
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("harness", "strategies", "workloads", "ragged_kernels")


def module_files() -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports anywhere in its file (top level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level-1 packages
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `from a.b import f`: the module a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imported_modules(name, path, set(files)) for name, path in files.items()}


def is_entry_point(path: Path) -> bool:
    return path.name == "__main__.py" or 'if __name__ == "__main__":' in path.read_text()


def test_no_module_imports_another_that_imports_it_back():
    graph = import_graph()
    assert "harness.job" in graph["harness.__main__"]  # the walk sees imports at all
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        raise AssertionError(f"an import circle: {' -> '.join(e.args[1])}") from None


def test_only_entry_points_import_the_composition_root():
    files = module_files()
    importers = {name for name, deps in import_graph().items() if "harness.job" in deps}
    assert importers and all(is_entry_point(files[name]) for name in importers), sorted(importers)


def test_strategies_and_workloads_import_nothing_from_the_harness():
    for name, deps in import_graph().items():
        if name.startswith(("strategies", "workloads")):
            assert not any(d.startswith("harness") for d in deps), (name, deps)


def test_the_walk_finds_a_circle_hidden_in_a_function(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from a import g\n")
    files = {"a": tmp_path / "a.py", "b": tmp_path / "b.py"}
    graph = {name: imported_modules(name, path, set(files)) for name, path in files.items()}
    assert graph == {"a": {"b"}, "b": {"a"}}
