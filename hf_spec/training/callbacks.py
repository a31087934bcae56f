"""Trainer callbacks of hf-spec's training scripts."""

from __future__ import annotations

import json
import os
import time

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

CLOCK_FILE = "training_clock.json"
"""Where :class:`TrainingClock` keeps, in each checkpoint folder, the wall seconds trained up to that checkpoint."""


class TrainingClock(TrainerCallback):
    """Wall seconds of a training summed over all its runs: a run resumed from a checkpoint adds its own time to
    what that checkpoint recorded (:data:`CLOCK_FILE`, written into every checkpoint it saves). Trainer's own
    ``train_runtime`` covers the last run only, so a training resumed across sessions would report a fraction of
    its cost. :attr:`seconds` is the sum so far; :attr:`complete` is False when the run resumed from a checkpoint
    without a record (its earlier time is unknown, so :attr:`seconds` is a lower bound)."""

    def __init__(self):
        self.before = 0.0
        self.complete = True
        self._started = None

    @property
    def seconds(self) -> float:
        return self.before + (time.perf_counter() - self._started if self._started is not None else 0.0)

    def on_train_begin(self, args, state, control, **kwargs):
        self._started = time.perf_counter()
        if state.global_step > 0:  # resumed: Trainer restored the checkpoint's state before this call
            record = os.path.join(_checkpoint_folder(args, state), CLOCK_FILE)
            try:
                with open(record) as f:
                    saved = json.load(f)
                self.before, self.complete = float(saved["seconds"]), bool(saved.get("complete", True))
            except (OSError, ValueError, KeyError):
                self.before, self.complete = 0.0, False

    def on_save(self, args, state, control, **kwargs):
        folder = _checkpoint_folder(args, state)
        if state.is_world_process_zero and os.path.isdir(folder):
            with open(os.path.join(folder, CLOCK_FILE), "w") as f:
                json.dump({"seconds": self.seconds, "complete": self.complete}, f)


def _checkpoint_folder(args, state) -> str:
    """The folder Trainer saves (and resumes) the checkpoint of ``state.global_step`` in."""
    return os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
