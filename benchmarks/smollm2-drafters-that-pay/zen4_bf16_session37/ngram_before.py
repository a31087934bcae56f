"""Session 36's n-gram module, for the "before" arms of ab_scored.py and ../../ngram_policy/scored.py.

`load()` reads hf_spec/drafters/ngram.py as it was at commit 29dce00 (the last before the scored trees) from this
repository's git history and runs it as the module `hf_spec.drafters._ngram_before` inside the installed package,
so its relative imports resolve against today's hf_spec (nothing else it imports changed since).
"""
import os
import subprocess
import sys
import types

BEFORE_COMMIT = "29dce00"
MODULE = "hf_spec.drafters._ngram_before"


def load() -> types.ModuleType:
    """The session-36 module (loaded once per process)."""
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    path = f"{BEFORE_COMMIT}:hf_spec/drafters/ngram.py"
    source = subprocess.run(["git", "show", path], cwd=os.path.dirname(os.path.abspath(__file__)), check=True,
                            capture_output=True, text=True).stdout  # fmt: skip
    module = types.ModuleType(MODULE)
    module.__package__, module.__file__ = "hf_spec.drafters", f"<git {path}>"
    sys.modules[MODULE] = module  # dataclasses look their module up while the class body runs
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module
