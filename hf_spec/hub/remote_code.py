"""Remote code for saved drafters: load an hf-spec checkpoint with ``trust_remote_code=True``
on a machine without hf-spec installed.

The scheme
----------
transformers' dynamic-module loader (``transformers.dynamic_module_utils``) resolves a class
named in ``config.json``'s ``auto_map`` (``"modeling_hf_spec.EagleDrafter"``) by copying the
file ``modeling_hf_spec.py`` from the checkpoint into its module cache
(``HF_MODULES_CACHE/transformers_modules/<name>/<hash>/``), together with every file that the
module names in a line of the form ``from .<name> import ...`` (followed recursively, found by a
regular expression). Only that flat, one-dot form is understood: ``from ..tree.dynamic import``,
``from . import compat`` or absolute ``hf_spec.*`` imports would not be copied (or would import
the real package). Absolute imports of other packages must be installed (``check_imports``),
except inside ``try:`` blocks.

So at save time this module generates a *self-contained, flat module set* from the installed
hf_spec source (never hand-copied, so the remote code always matches the package that wrote the
weights):

1. Start from the modules that define the drafter's model and config classes (their ``__module__``:
   no family or path is named here, so every family of :data:`hf_spec.drafters.registry.DRAFTER_CLASSES`
   works as registered) and follow their hf_spec imports (relative, or absolute ``hf_spec.*``) to the
   closure of needed modules.
   Package ``__init__`` files are never needed: only modules are imported.
2. Write each module ``hf_spec.a.b`` as ``hf_spec_a_b.py`` with every hf_spec import rewritten
   to the flat form: ``from ..tree.dynamic import X`` -> ``from .hf_spec_tree_dynamic import X``;
   ``from .. import compat`` -> ``from . import hf_spec_compat as compat``.
3. Nothing is cut: the drafter modules import nothing of :mod:`hf_spec.hub` (a hub module in the
   closure is an error). Their Hub behaviour comes through hooks that this package fills when
   imported (:data:`hf_spec.drafters.registry.HUB_HOOKS`); in the remote-code copy nothing fills
   them, so a remote-code drafter uses transformers' own ``save_pretrained``/``push_to_hub``,
   which re-copies this module set because the loader registers the classes for their auto class.
4. Write the entry module ``modeling_hf_spec.py``: it imports the config class, subclasses the
   model class with :data:`_REMOTE_GUARD` (``generate()`` and use as ``assistant_model``
   explain that tree decoding needs ``pip install hf-spec``), and imports every module of the
   set in the ``from .x import`` form, so the loader copies all of them (the ``from . import``
   form of step 2 is invisible to it).
5. Add ``auto_map = {"AutoConfig": "modeling_hf_spec.<Config>", "AutoModel":
   "modeling_hf_spec.<Model>"}`` to ``config.json``. Config and model come from one entry file,
   so both resolve to the same cached module (same hash) and the same classes.

With hf-spec installed and imported, ``AutoModel.from_pretrained(dir)`` keeps using the
package's own classes: transformers prefers explicitly registered non-transformers classes
over ``auto_map`` even with ``trust_remote_code=True``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
from pathlib import Path

from ..version import __version__

ENTRY_MODULE = "modeling_hf_spec"
"""Name (without .py) of the entry module the ``auto_map`` points to."""

FLAT_PREFIX = "hf_spec_"
_PACKAGE = "hf_spec"


def flat_name(module_name: str) -> str:
    """``hf_spec.tree.dynamic`` -> ``hf_spec_tree_dynamic`` (the file name in the saved set)."""
    if module_name != _PACKAGE and not module_name.startswith(_PACKAGE + "."):
        raise ValueError(f"{module_name!r} is not an hf_spec module")
    return FLAT_PREFIX + module_name[len(_PACKAGE) + 1 :].replace(".", "_")


def _source_path(module_name: str) -> Path:
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        raise ValueError(f"Cannot find the source of {module_name!r}.")
    return Path(spec.origin)


def _is_package(module_name: str) -> bool:
    spec = importlib.util.find_spec(module_name)
    return spec is not None and spec.submodule_search_locations is not None


def _resolve(node: ast.ImportFrom, current: str) -> list[tuple[str, str | None]]:
    """The hf_spec modules an ``ImportFrom`` node pulls in: [(module, alias-or-None)].

    ``alias`` is set when a *module* is imported by name (``from .. import compat``): the
    rewritten statement must bind that name to the module.
    """
    if node.level:
        package = current.rsplit(".", node.level)[0]
        base = f"{package}.{node.module}" if node.module else package
    elif node.module and (node.module == _PACKAGE or node.module.startswith(_PACKAGE + ".")):
        base = node.module
    else:
        return []
    if not _is_package(base):
        return [(base, None)]
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if importlib.util.find_spec(sub) is None or _is_package(sub):
            raise ValueError(
                f"{current} imports {alias.name!r} from the package {base!r}; remote code can only follow imports of "
                f"modules. Fix: import it from the module that defines it (e.g. `from {base}.<module> import "
                f"{alias.name}`)."
            )
        out.append((sub, alias.asname or alias.name))
    return out


def _rewrite(module_name: str) -> tuple[str, set[str]]:
    """(flat source of ``module_name``, the hf_spec modules it imports)."""
    source = _source_path(module_name).read_text(encoding="utf-8")
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits, needed = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any(a.name == _PACKAGE or a.name.startswith(_PACKAGE + ".") for a in node.names):
                raise ValueError(f"{module_name}: `import hf_spec...` cannot be turned into remote code; use `from`.")
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        resolved = _resolve(node, module_name)
        if not resolved:
            continue
        indent = lines[node.lineno - 1][: node.col_offset]
        if resolved[0][1] is None:  # from <module> import names
            target = resolved[0][0]
            names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
            new = f"from .{flat_name(target)} import {names}"
        else:  # from <package> import module [as alias], ...
            new = "\n".join(f"{indent if i else ''}from . import {flat_name(m)} as {alias}"
                            for i, (m, alias) in enumerate(resolved))  # fmt: skip
        needed.update(m for m, _ in resolved)
        edits.append((node.lineno, node.end_lineno, node.col_offset, new))
    for start, end, col, new in sorted(edits, reverse=True):
        tail = lines[end - 1]
        # keep a trailing comment/newline of the last line; the statement itself ends the line
        newline = "\n" if tail.endswith("\n") else ""
        lines[start - 1 : end] = [lines[start - 1][:col] + new + newline]
    return "".join(lines), needed


def module_closure(roots: list[str]) -> dict[str, str]:
    """{module name: rewritten flat source} for ``roots`` and every hf_spec module they import."""
    todo, done = list(dict.fromkeys(roots)), {}
    while todo:
        name = todo.pop()
        if name in done:
            continue
        if name.startswith(f"{_PACKAGE}.hub"):
            raise ValueError(f"{name} is imported by a drafter module; hub code cannot be remote code (the drafters "
                             "reach it through hf_spec.drafters.registry.HUB_HOOKS).")
        done[name], needed = _rewrite(name)
        todo.extend(sorted(needed - done.keys()))
    return done


_REMOTE_GUARD = '''
_NEEDS_HF_SPEC = (
    "{what}: this drafter was loaded from remote code (trust_remote_code=True), which can bind to its target "
    "(`drafter.bind(target)`) and run forward passes, but hf-spec's tree speculative decoding "
    "(`target.generate(input_ids, assistant_model=drafter)`) needs the hf-spec package. Fix: `pip install hf-spec`, "
    "then `import hf_spec` and load the drafter with `AutoModel.from_pretrained(path)` (no trust_remote_code needed) "
    "or `hf_spec.{model_class}.from_pretrained(path)`."
)


class _RemoteCodeConfig:
    """Remote-code-only config behaviour. transformers' generate() first touches an assistant through
    ``assistant_model.config.get_text_config().vocab_size``; a drafter has no vocabulary of its own, so
    the attribute error says what to do (an AttributeError keeps ``getattr(config, "vocab_size", None)`` working)."""

    @property
    def vocab_size(self):
        raise AttributeError(_NEEDS_HF_SPEC.format(
            what=f"{type(self).__name__} has no vocab_size (it uses its target's, {self.target_vocab_size}); if it "
            "was passed as `assistant_model=` to generate()", model_class=MODEL_CLASS_NAME))


class _RemoteCodeDrafter:
    """Remote-code-only model behaviour."""

    _hf_spec_remote_code = True

    def generate(self, *args, **kwargs):
        raise RuntimeError(_NEEDS_HF_SPEC.format(what="A drafter does not generate on its own",
                                                 model_class=type(self).__name__))
'''


def _entry_source(model_class: type, config_class: type, modules: list[str], version: str) -> str:
    model_module, config_module = flat_name(model_class.__module__), flat_name(config_class.__module__)
    model_name, config_name = model_class.__name__, config_class.__name__
    manifest = "\n".join(f"from .{flat_name(m)} import __name__ as _{flat_name(m)}  # noqa: F401" for m in modules)
    return f'''# Generated by hf_spec.hub.remote_code (hf-spec {version}) when this drafter was saved; do not edit.
"""Remote-code entry point of an hf-spec {model_name}.

Loaded by ``AutoConfig/AutoModel.from_pretrained(path, trust_remote_code=True)`` without hf-spec
installed. The drafter binds to its target (``drafter.bind(target)``) and runs forward passes;
tree speculative decoding (``target.generate(ids, assistant_model=drafter)``) needs
``pip install hf-spec`` and ``import hf_spec``.
"""

from .{config_module} import {config_name} as _{config_name}
from .{model_module} import {model_name} as _{model_name}

# Every module of the set, in the `from .x import` form transformers' loader follows to copy files.
{manifest}

MODEL_CLASS_NAME = "{model_name}"
{_REMOTE_GUARD}

class {config_name}(_RemoteCodeConfig, _{config_name}):
    __doc__ = _{config_name}.__doc__


class {model_name}(_RemoteCodeDrafter, _{model_name}):
    __doc__ = _{model_name}.__doc__
    config_class = {config_name}


__all__ = ["{config_name}", "{model_name}"]
'''


def _hf_spec_class(cls: type) -> type:
    """The nearest class in ``cls``'s MRO defined inside hf_spec (remote code is generated from it)."""
    for klass in cls.__mro__:
        if klass.__module__.startswith(_PACKAGE + "."):
            return klass
    raise ValueError(f"{cls.__name__} does not derive from an hf_spec class; cannot generate its remote code.")


def remote_code_files(model_class: type, config_class: type) -> dict[str, str]:
    """{file name: source} of the remote-code set for a drafter family (entry module included)."""
    model_class, config_class = _hf_spec_class(model_class), _hf_spec_class(config_class)
    modules = module_closure([model_class.__module__, config_class.__module__])
    files = {}
    for name in sorted(modules):
        header = (f"# Generated from {name.replace('.', '/')}.py of hf-spec {__version__} by "
                  "hf_spec.hub.remote_code; do not edit (see modeling_hf_spec.py).\n")  # fmt: skip
        files[f"{flat_name(name)}.py"] = header + modules[name]
    files[f"{ENTRY_MODULE}.py"] = _entry_source(model_class, config_class, sorted(modules), __version__)
    return files


def auto_map(model_class: type, config_class: type) -> dict[str, str]:
    model_class, config_class = _hf_spec_class(model_class), _hf_spec_class(config_class)
    return {"AutoConfig": f"{ENTRY_MODULE}.{config_class.__name__}", "AutoModel": f"{ENTRY_MODULE}.{model_class.__name__}"}


def write_remote_code(model, save_directory: str | os.PathLike) -> list[str]:
    """Write the remote-code files of ``model`` (a drafter) into ``save_directory`` and add
    ``auto_map`` to its ``config.json``. Returns the file names written."""
    save_directory = Path(save_directory)
    files = remote_code_files(type(model), type(model.config))
    for stale in save_directory.glob(f"{FLAT_PREFIX}*.py"):  # a previous save of another version
        if stale.name not in files:
            stale.unlink()
    for name, source in files.items():
        (save_directory / name).write_text(source, encoding="utf-8")
    config_path = save_directory / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["auto_map"] = auto_map(type(model), type(model.config))
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return sorted(files)
