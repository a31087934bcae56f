"""The package's import graph: one decoding loop module that the integration point imports,
never the other way round, and no module-level import cycle anywhere in hf_spec."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "hf_spec"


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(name: str, path: pathlib.Path, modules) -> tuple[set[str], set[str]]:
    """(package modules imported at module level, those imported inside functions) by ``name``."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    top, lazy = set(), set()

    def targets(node) -> set[str]:
        if isinstance(node, ast.Import):
            return {alias.name for alias in node.names if alias.name in modules}
        base = package[: len(package) - node.level + 1] if node.level else []
        source = ".".join(base + ([node.module] if node.module else []))
        submodules = {f"{source}.{alias.name}" for alias in node.names} & modules.keys()
        # ``from . import compat`` imports the submodule, not the package's own __init__
        return submodules if len(submodules) == len(node.names) else submodules | ({source} & modules.keys())

    def visit(nodes, inside_function: bool) -> None:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                (lazy if inside_function else top).update(targets(node) - {name})
            else:
                visit(ast.iter_child_nodes(node),
                      inside_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))  # fmt: skip

    visit(ast.parse(path.read_text()).body, False)
    return top, lazy


def test_no_module_level_import_cycle_in_the_package():
    modules = _modules()
    graph = {name: _imports(name, path, modules)[0] for name, path in modules.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def cycle_from(name: str, path: list[str]) -> list[str] | None:
        state[name] = 1
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                return path[path.index(other) :] + [other] if other in path else [name, other]
            if other not in state:
                found = cycle_from(other, path + [other])
                if found:
                    return found
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            assert cycle_from(name, [name]) is None, "module-level import cycle"


def test_the_loop_module_does_not_import_the_integration_point():
    modules = _modules()
    loop_top, loop_lazy = _imports("hf_spec.decoding", modules["hf_spec.decoding"], modules)
    entry_top, entry_lazy = _imports("hf_spec.generation", modules["hf_spec.generation"], modules)
    assert "hf_spec.generation" not in loop_top | loop_lazy
    assert "hf_spec.decoding" in entry_top
    assert not loop_lazy and not entry_lazy, (loop_lazy, entry_lazy)  # no imports hidden inside functions
    assert "hf_spec.batched" not in modules  # one loop: batch 1 is a row of it


def test_importing_the_loop_module_first_works():
    code = "import hf_spec.decoding as d, hf_spec.generation as g; assert g.decode is d.decode"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)
