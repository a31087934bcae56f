"""The package's import graph, imports inside functions included: one decoding loop module that the integration
point imports, never the other way round; no import cycle anywhere in hf_spec; nothing imports the package root;
the cost model and the speed controller at the bottom."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "hf_spec"


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(name: str, path: pathlib.Path, modules) -> tuple[set[str], set[str]]:
    """(package modules imported at module level, those imported inside functions) by ``name``, ``__import__`` and
    ``importlib.import_module`` of a literal name included."""
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

    def dynamic(node) -> set[str]:  # __import__("hf_spec...") and importlib.import_module("hf_spec...")
        function = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if function in ("__import__", "import_module") and node.args and isinstance(node.args[0], ast.Constant):
            return {node.args[0].value} & modules.keys()
        return set()

    def visit(nodes, inside_function: bool) -> None:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                (lazy if inside_function else top).update(targets(node) - {name})
            else:
                if isinstance(node, ast.Call):
                    (lazy if inside_function else top).update(dynamic(node) - {name})
                visit(ast.iter_child_nodes(node),
                      inside_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))  # fmt: skip

    visit(ast.parse(path.read_text()).body, False)
    return top, lazy


def _graph(modules) -> dict[str, set[str]]:
    """Every package module -> the package modules it imports, at module level or inside functions."""
    return {name: set().union(*_imports(name, path, modules)) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def cycle_from(name: str, path: list[str]) -> list[str] | None:
        state[name] = 1
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                return path[path.index(other) :] + [other]
            if other not in state:
                found = cycle_from(other, path + [other])
                if found:
                    return found
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            found = cycle_from(name, [name])
            if found:
                return found
    return None


def test_no_import_cycle_in_the_package_inside_functions_either():
    """No circle, counting imports inside functions too: a function-level import hides a cycle, it does not
    break it (the layers still depend on each other both ways)."""
    found = _cycle(_graph(_modules()))
    assert found is None, "import cycle: " + " -> ".join(found)


def test_the_cycle_check_sees_imports_inside_functions(tmp_path):
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import x\n    return x\n")
    (tmp_path / "c.py").write_text("def f():\n    return __import__('pkg.a').x\n")
    modules = {"pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py", "pkg.c": tmp_path / "c.py"}
    assert _imports("pkg.b", modules["pkg.b"], modules) == (set(), {"pkg.a"})
    assert _imports("pkg.c", modules["pkg.c"], modules) == (set(), {"pkg.a"})
    assert _cycle(_graph(modules)) == ["pkg.a", "pkg.b", "pkg.a"]
    assert _cycle({"pkg.a": {"pkg.b"}, "pkg.b": set()}) is None


def test_nothing_inside_the_package_imports_its_root():
    """``hf_spec/__init__.py`` sits at the top of the house (it imports every layer to export its names); modules
    import what they need from the submodule that defines it."""
    graph = _graph(_modules())
    assert not [name for name, imported in graph.items() if "hf_spec" in imported]


BOTTOM = ("hf_spec.compat", "hf_spec.kernel_trials", "hf_spec.linear_kernels", "hf_spec.attention_kernels", "hf_spec.timing", "hf_spec.cache", "hf_spec.tree", "hf_spec.stats", "hf_spec.resources",
          "hf_spec.hardware", "hf_spec.shape_select")  # fmt: skip
"""What the bottom of the house (the cost model and the speed controller) may import: modules that import nothing
above them (``hf_spec.tree`` with its submodules; ``shape_select`` is pure: candidates and cost-curve helpers)."""
ABOVE = ("hf_spec.drafters", "hf_spec.tune", "hf_spec.decoding", "hf_spec.generation", "hf_spec.bench", "hf_spec.hub",
         "hf_spec.training", "hf_spec.cli", "hf_spec.demo")  # fmt: skip


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("module", ["hf_spec.verify_cost", "hf_spec.controller"])
def test_the_cost_model_and_the_controller_sit_at_the_bottom_of_the_house(module):
    modules = _modules()
    if module not in modules:
        pytest.skip(f"{module} does not exist yet")
    graph = _graph(modules)
    assert graph[module] <= {m for m in modules if _within(m, BOTTOM)}, sorted(graph[module])
    reached, todo = set(), [module]
    while todo:  # and nothing they import reaches further up
        for other in graph[todo.pop()] - reached:
            reached.add(other)
            todo.append(other)
    assert not [m for m in reached if _within(m, ABOVE)], sorted(reached)


def test_shape_candidates_are_pure():
    modules = _modules()
    assert _graph(modules)["hf_spec.shape_select"] == set()


def test_the_loop_module_does_not_import_the_integration_point():
    modules = _modules()
    loop_top, loop_lazy = _imports("hf_spec.decoding", modules["hf_spec.decoding"], modules)
    entry_top, entry_lazy = _imports("hf_spec.generation", modules["hf_spec.generation"], modules)
    assert "hf_spec.generation" not in loop_top | loop_lazy
    assert "hf_spec.decoding" in entry_top
    assert not loop_lazy and not entry_lazy, (loop_lazy, entry_lazy)  # no imports hidden inside functions


def test_importing_the_loop_module_first_works():
    code = "import hf_spec.decoding as d, hf_spec.generation as g; assert g.decode is d.decode"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


# -- benchmarks/ use the public API only ----------------------------------------------------------
BENCHMARKS = PACKAGE.parent / "benchmarks"


def _public_names() -> set[str]:
    """``hf_spec.__all__``, read from ``hf_spec/__init__.py`` without importing it."""
    for node in ast.parse((PACKAGE / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("hf_spec/__init__.py defines no __all__")


def _non_public_uses(source: str, public: set[str]) -> list[str]:
    """What ``source`` takes from hf_spec beyond its top-level public names: ``import hf_spec.x``, ``from hf_spec.x
    import ...``, ``from hf_spec import <not in __all__>``, ``hf_spec.<not in __all__>`` attributes (dunders such as
    ``__version__`` allowed) and ``__import__``/``import_module`` of a submodule."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [f"{line}: import {a.name}" for a in node.names if a.name.startswith("hf_spec.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("hf_spec"):
            if node.module != "hf_spec":
                found.append(f"{line}: from {node.module} import ...")
            else:
                found += [f"{line}: from hf_spec import {a.name}" for a in node.names if a.name not in public]
        elif isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "hf_spec":
            if node.attr not in public and not node.attr.startswith("__"):
                found.append(f"{line}: hf_spec.{node.attr}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
            "__import__", "import_module"
        ) and node.args and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("hf_spec."):
            found.append(f"{line}: import of {node.args[0].value}")
    return sorted(found, key=lambda use: int(use.split(":")[0]))


def test_the_benchmark_check_catches_private_imports():
    public = {"EagleDrafter", "DraftingSession"}
    source = ("import hf_spec\nimport hf_spec.hardware\nfrom hf_spec.drafters.session import DraftingSession\n"
              "from hf_spec import EagleDrafter, _Target\nx = hf_spec.timing.clock()\ny = hf_spec.EagleDrafter\n"
              "v = hf_spec.__version__\nimportlib.import_module('hf_spec.decoding')\n")  # fmt: skip
    assert [use.split(":")[0] for use in _non_public_uses(source, public)] == ["2", "3", "4", "5", "8"]
    assert _non_public_uses("import hf_spec\nfrom hf_spec import DraftingSession\n", public) == []


def test_benchmark_scripts_import_only_the_top_level_public_api():
    """Every ``benchmarks/**/*.py`` takes from hf_spec only names of ``hf_spec.__all__``: benchmarks are what users
    can run, and a module moved inside the package (e.g. a drafter family into its own package) must not break one."""
    public = _public_names()
    scripts = sorted(BENCHMARKS.rglob("*.py"))
    assert scripts
    bad = {str(p.relative_to(BENCHMARKS)): uses for p in scripts if (uses := _non_public_uses(p.read_text(), public))}
    assert not bad, f"benchmarks use hf_spec beyond its public names (export them from hf_spec/__init__.py): {bad}"


DRAFTER_FREE_OF = ("hf_spec.hub", "hf_spec.tune", "hf_spec.decoding", "hf_spec.generation", "hf_spec.bench",
                   "hf_spec.training", "hf_spec.cli", "hf_spec.demo", "hf_spec.verify_cost")  # fmt: skip
"""What the drafter modules never reach: the Hub code, the loop and everything above it, and this machine's
measurements (the loop hands them over). Remote code copies a drafter's modules as they are, with no cut."""
LOOP_SIDE_DRAFTER_MODULES = ("hf_spec.drafters.auto", "hf_spec.drafters.hybrid")
"""AutoDrafter (it loads through :mod:`hf_spec.hub.convert`) and the n-gram hybrid the loop wraps sessions in
(sized by :mod:`hf_spec.verify_cost`): drafter-side modules that no family module imports."""


def test_drafter_modules_reach_no_hub_loop_or_measuring_code():
    modules = _modules()
    graph = _graph(modules)
    drafter_modules = [m for m in modules if _within(m, ("hf_spec.drafters",)) and not _within(m, LOOP_SIDE_DRAFTER_MODULES)]
    assert "hf_spec.drafters.base" in drafter_modules
    for module in drafter_modules:
        reached, todo = set(), [module]
        while todo:
            for other in graph[todo.pop()] - reached:
                reached.add(other)
                todo.append(other)
        assert not [m for m in reached if _within(m, DRAFTER_FREE_OF + LOOP_SIDE_DRAFTER_MODULES)], (module, sorted(reached))
