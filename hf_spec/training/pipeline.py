"""What the training scripts share: target loading, the feature cache, the drafter, the Trainer run.

``training_scripts/train_eagle.py``, ``train_hass.py``, ``train_eagle3.py`` and ``train_parallelspec.py``
are thin ``main()``s over :func:`train_drafter`, so every feature drafter trains on the same chat-templated,
assistant-masked data and the same cached target features. EAGLE-3 also reads the inputs of three target
layers: its run extends the cache (a copy beside it, :func:`~hf_spec.training.data.add_layer_features`)
with them once, and trains on the same examples.
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path
from dataclasses import asdict, dataclass, field

import torch
from transformers.trainer_utils import get_last_checkpoint

from .. import draft_vocab
from ..drafters import EagleDrafter
from ..drafters.auto import AutoDrafter
from ..drafters.eagle.router import frequency_order
from ..drafters.eagle.config import EagleDrafterConfig
from ..drafters.eagle3.config import Eagle3DrafterConfig, default_aux_layer_ids
from ..drafters.parallelspec.config import ParallelDrafterConfig
from ..drafters.registry import drafter_classes
from ..hardware import resolve_dtype
from ..resources import cache_dir
from .callbacks import TrainingClock
from .collators import FeatureCollator
from .data import (
    _META_FILE,
    add_layer_features,
    build_feature_cache,
    feature_cache_dir,
    layer_cache_dir,
    load_conversations,
    load_feature_cache,
    load_target,
)
from .parallelspec import ParallelTrainer
from .trainers import CoralTrainer, Eagle3Trainer, EagleTrainer, HassTrainer, RouterTrainer, recipe_settings

_EAGLE, _EAGLE3, _PARALLEL = (EagleDrafterConfig.model_type, Eagle3DrafterConfig.model_type,
                              ParallelDrafterConfig.model_type)  # fmt: skip
METHODS = {
    "eagle": (_EAGLE, EagleTrainer),
    "hass": (_EAGLE, HassTrainer),
    "coral": (_EAGLE, CoralTrainer),
    "eagle3": (_EAGLE3, Eagle3Trainer),
    "parallelspec": (_PARALLEL, ParallelTrainer),
}
"""training method -> (``model_type`` of the drafter family it trains, Trainer class). The family's classes come
from :mod:`hf_spec.drafters.registry` (:func:`method_drafter_class`), the table loading, conversion, export and
cards read too."""


def method_drafter_class(method: str) -> type:
    """The drafter class ``method`` trains: the model class the registry holds for its family's ``model_type``."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")
    return drafter_classes(METHODS[method][0])[1]


@dataclass
class DataArguments:
    """Target, data and feature-cache options shared by every drafter training script."""

    target_model: str = field(default="smollm2-135m-instruct", metadata={"help": "packaged model name or local path"})
    dataset: str = field(default="sharegpt", metadata={"help": "sharegpt | chitchat | path to a .jsonl of conversations"})
    num_conversations: int | None = field(default=None, metadata={"help": "use the first N usable conversations (all if unset)"})
    feature_dtype: str = field(default="auto", metadata={"help": "dtype the target runs in when caching features; match "
                                                                "the dtype you will decode in (auto: bf16 where this "
                                                                "device computes it natively, else float32)"})
    feature_storage: str = field(default="bfloat16", metadata={"help": "on-disk feature dtype: bfloat16 | float16 | float32"})
    feature_cache: str | None = field(default=None, metadata={"help": "feature cache directory (default: derived from the "
                                                                      "target/data/length under $HF_SPEC_CACHE/features)"})
    num_layers: int = field(default=1, metadata={"help": "drafter decoder layers (EAGLE/HASS: 1); with --init_drafter, "
                                                 "more than the checkpoint's grows it without changing its function"})
    draft_vocab_size: int | None = field(default=8192, metadata={"help": "draft vocabulary: the D most frequent assistant "
                                                                     "tokens of the data (FR-Spec/EAGLE-3); 0 or unset: the "
                                                                     "full target vocabulary"})
    eval_examples: int = field(default=0, metadata={"help": "hold out this many examples of the feature cache (a seeded "
                                                     "random draw) as the evaluation set: with --eval_strategy steps "
                                                     "the run logs held-out loss and teacher-forced top-1 per step "
                                                     "(eval_top1_<step>) beside the training ones"})
    init_drafter: str | None = field(default=None, metadata={"help": "warm start: a trained drafter folder of the same "
                                                                "family to continue training (e.g. on new data); its "
                                                                "weights, draft vocabulary and layers are kept"})


def prepare_features(data_args: DataArguments, training_args, aux_layer_ids=None):
    """(target, tokenizer, cache dir, feature dataset, storage dtype): loads the target and builds the
    feature cache on first use (main process first under accelerate).

    ``aux_layer_ids``: target layer ids (or a function of the target giving them) whose inputs the drafter
    reads (EAGLE-3): the cache is then the copy of the feature cache extended with them
    (:func:`~hf_spec.training.data.layer_cache_dir`), built on first use."""
    # the Trainer's device: features are cached where the drafter trains, and the drafter, which only borrows the
    # target's embedding and LM head, finds them there (Trainer's own move of the drafter would leave them behind)
    device = training_args.device
    target, tokenizer = load_target(data_args.target_model, resolve_dtype(data_args.feature_dtype, device))
    target = target.to(device)
    cache = data_args.feature_cache or feature_cache_dir(
        str(cache_dir() / "features"), data_args.target_model, data_args.dataset, data_args.num_conversations,
        training_args.max_length, data_args.feature_storage,
    )  # fmt: skip
    with training_args.main_process_first(desc="feature cache"):
        if not os.path.exists(os.path.join(cache, _META_FILE)):
            conversations = load_conversations(data_args.dataset, data_args.num_conversations)
            build_feature_cache(target, tokenizer, conversations, cache, training_args.max_length,
                                data_args.feature_storage)  # fmt: skip
    if aux_layer_ids is not None:
        aux_layer_ids = sorted(aux_layer_ids(target) if callable(aux_layer_ids) else aux_layer_ids)
        meta = json.loads(Path(cache, _META_FILE).read_text())
        if meta.get("aux_hidden_state_layer_ids") is None:  # a plain cache: use (or make) its extended copy
            base, cache = cache, layer_cache_dir(cache, aux_layer_ids)
            with training_args.main_process_first(desc="target layer features"):
                if not os.path.exists(os.path.join(cache, _META_FILE)):
                    print(f"[hf_spec] adding the inputs of target layers {aux_layer_ids} to {base} -> {cache}", flush=True)
                    add_layer_features(base, target, aux_layer_ids, cache)
    dataset, storage = load_feature_cache(cache, aux_layer_ids)
    return target, tokenizer, cache, dataset, storage


def assistant_token_counts(dataset, vocab_size: int) -> torch.Tensor:
    """How often each token id is a loss (assistant) token in a feature cache: the token
    frequency that orders CORAL's router groups."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for row in dataset.select_columns(["input_ids", "loss_mask"]).with_format("torch"):
        counts += torch.bincount(row["input_ids"][row["loss_mask"].bool()].long(), minlength=vocab_size)[:vocab_size]
    return counts


def cache_is_self_distilled(cache: str) -> bool:
    """Whether a feature cache was written by :func:`hf_spec.training.distill.distill_features`, i.e. its
    answer tokens are the target's own greedy choices."""
    meta = Path(cache, _META_FILE)
    return meta.exists() and json.loads(meta.read_text()).get("source") == "distill_features"


def attach_draft_vocab(drafter, dataset, size: int | None) -> float | None:
    """Give a fresh ``drafter`` a draft vocabulary of the ``size`` most frequent assistant tokens of the
    feature cache ``dataset`` and print its coverage; ``size`` 0/None or >= V keeps the full vocabulary.
    Returns the coverage (share of assistant tokens inside the draft vocabulary) or None."""
    vocab = drafter.config.target_vocab_size
    if not size or size >= vocab:
        return None
    counts = assistant_token_counts(dataset, vocab)
    drafter.set_draft_vocab(counts, size)
    share = draft_vocab.coverage(counts, drafter.draft_ids)
    print(f"[hf_spec] draft vocabulary: {size} of {vocab} target ids cover {share:.2%} of the assistant tokens",
          flush=True)  # fmt: skip
    return share


def warm_start_drafter(drafter_class, path: str, target, method: str, dataset, num_layers: int | None = None):
    """(drafter, coverage): a trained ``drafter_class`` checkpoint at ``path``, bound to ``target`` in float32 to be
    trained further by ``method`` on ``dataset``: weights, layers and draft vocabulary are kept (the vocabulary's
    coverage of the new data is printed and returned beside it, None without a draft vocabulary).

    ``num_layers`` above the checkpoint's grows an EAGLE-family drafter without changing its function
    (:func:`grow_layers`), so the extra capacity starts from the trained drafter rather than from scratch."""
    try:
        drafter = AutoDrafter.from_pretrained(path)  # the family its config names, not a silent reinterpretation
    except (OSError, ValueError) as err:
        raise ValueError(f"--init_drafter {path!r} is not a {drafter_class.__name__} checkpoint ({err}). Fix: pass a "
                         f"folder written by save_pretrained/publish_drafter.py for this training method.") from err  # fmt: skip
    if type(drafter) is not drafter_class:  # ParallelDrafter subclasses EagleDrafter but trains differently
        raise ValueError(f"--init_drafter {path!r} holds a {type(drafter).__name__}, but {method} trains a "
                         f"{drafter_class.__name__}. Fix: start from a drafter of the same family.")  # fmt: skip
    if num_layers and num_layers > drafter.config.num_layers:
        drafter = grow_layers(drafter, num_layers)
    drafter = drafter.float().bind(target)
    drafter.config.training_method = method
    share = None
    if drafter.has_draft_vocab:
        counts = assistant_token_counts(dataset, drafter.config.target_vocab_size)
        share = draft_vocab.coverage(counts, drafter.draft_ids)
        print(f"[hf_spec] warm start from {path}: its draft vocabulary ({drafter.config.draft_vocab_size} ids) covers "
              f"{share:.2%} of this data's assistant tokens", flush=True)  # fmt: skip
    return drafter, share


def grow_layers(drafter: EagleDrafter, num_layers: int) -> EagleDrafter:
    """A copy of ``drafter`` with ``num_layers`` decoder layers computing exactly the same function: its layers
    and weights are kept and each new layer's residual branches start at zero (attention output and MLP down
    projections zeroed, as zero-initialised residual blocks), so training continues from the trained drafter."""
    if type(drafter) is not EagleDrafter:
        raise ValueError(f"Growing layers is defined for EagleDrafter (EAGLE/HASS/CORAL), not {type(drafter).__name__}. "
                         "Fix: drop --num_layers, or train that family from scratch with more layers.")  # fmt: skip
    config = copy.deepcopy(drafter.config)
    old_layers, config.num_layers = config.num_layers, num_layers
    grown = EagleDrafter(config).to(dtype=drafter.fc.weight.dtype)
    missing, unexpected = grown.load_state_dict(drafter.state_dict(), strict=False)
    if unexpected or any(not k.startswith("layers.") or int(k.split(".")[1]) < old_layers for k in missing):
        raise ValueError(f"Cannot grow this checkpoint: missing {missing}, unexpected {unexpected}.")
    with torch.no_grad():
        for layer in grown.layers[old_layers:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    grown.ngram_datastore = getattr(drafter, "ngram_datastore", None)
    return grown


def with_lengths(dataset, column: str = "length"):
    """The feature dataset with a ``column`` of sequence lengths (read from ``input_ids`` alone), which
    Trainer's ``group_by_length`` sampling needs to batch similar lengths without loading features."""
    if column in dataset.column_names:
        return dataset
    lengths = [len(ids) for ids in dataset.select_columns(["input_ids"])["input_ids"]]
    return dataset.add_column(column, lengths)


def split_held_out(dataset, eval_examples: int, seed: int = 0):
    """(training set, held-out set or None): ``eval_examples`` examples drawn at random (fixed seed, so a resumed
    run holds out the same ones) are left out of training."""
    if not eval_examples:
        return dataset, None
    if not 0 < eval_examples < len(dataset):
        raise ValueError(f"--eval_examples {eval_examples} must be between 1 and the cache's {len(dataset) - 1} "
                         "examples less one. Fix: hold out fewer, or 0 for none.")  # fmt: skip
    split = dataset.train_test_split(test_size=eval_examples, seed=seed, shuffle=True)
    return split["train"], split["test"]


def training_split(dataset, training_args, eval_examples: int = 0):
    """(training set, held-out set or None) of a feature cache (:func:`split_held_out`), lengths added where
    Trainer's ``group_by_length`` sampling needs them. Whatever is learnt from the data before training (the
    draft vocabulary, the router's groups) is counted on the training set only."""
    if getattr(training_args, "train_sampling_strategy", None) == "group_by_length":
        dataset = with_lengths(dataset, training_args.length_column_name)
    return split_held_out(dataset, eval_examples)


def _feature_trainer(trainer_class, drafter, training_args, dataset, held_out, storage, tokenizer):
    """``trainer_class`` over the training set ``dataset`` of a feature cache (batches from
    :class:`FeatureCollator`), with ``held_out`` (None: none) as the evaluation set (:func:`training_split`)."""
    return trainer_class(
        model=drafter,
        args=training_args,
        train_dataset=dataset.with_format("numpy"),
        eval_dataset=None if held_out is None else held_out.with_format("numpy"),
        data_collator=FeatureCollator(storage=storage, max_length=training_args.max_length,
                                      pad_token_id=tokenizer.pad_token_id or 0),  # fmt: skip
        callbacks=[TrainingClock()],
    )


def train_router(drafter_path: str, data_args: DataArguments, training_args) -> EagleDrafter:
    """CORAL stage 2: load a trained drafter, attach a router over groups of the training data's
    token-frequency order (of its draft vocabulary, if it has one), train only the router (drafter frozen) and save the drafter with it."""
    target, tokenizer, cache, dataset, storage = prepare_features(data_args, training_args)
    target = target.float()
    drafter = method_drafter_class("coral").from_pretrained(drafter_path).bind(target)
    drafter.config.training_method = "coral"
    dataset, held_out = training_split(dataset, training_args, data_args.eval_examples)
    counts = assistant_token_counts(dataset, drafter.config.target_vocab_size)
    if drafter.has_draft_vocab:  # the router's groups partition the draft vocabulary (D indices)
        counts = counts[drafter.draft_ids.cpu()]
    order = frequency_order(counts)
    drafter.requires_grad_(False)
    drafter.add_router(order, training_args.router_num_groups, training_args.router_top_n).requires_grad_(True)
    trainer = _feature_trainer(RouterTrainer, drafter, training_args, dataset, held_out, storage, tokenizer)
    result = trainer.train()
    if trainer.is_world_process_zero():
        drafter.save_pretrained(training_args.output_dir)
        summary = {"stage": "router", "drafter": drafter_path, "feature_cache": cache,
                   "global_step": trainer.state.global_step, **training_runtime(trainer, result),
                   "log_history": trainer.state.log_history}  # fmt: skip
        with open(os.path.join(training_args.output_dir, "router_training_summary.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return drafter


def train_drafter(method: str, data_args: DataArguments, training_args, **drafter_config) -> EagleDrafter:
    """Cache features if needed, then train (or resume) a feature drafter with ``method``'s
    Trainer and save it. ``drafter_config``: extra config fields of the drafter class
    (e.g. ParallelSpec's ``num_mask_tokens``)."""
    drafter_class = method_drafter_class(method)
    model_type, trainer_class = METHODS[method]
    start = time.time()
    aux_layer_ids = None
    if model_type == _EAGLE3:  # the layers it fuses: given, or EAGLE-3's default (2, L//2, L-3)
        given = drafter_config.get("eagle_aux_hidden_state_layer_ids")
        aux_layer_ids = given or (lambda t: default_aux_layer_ids(t.config.get_text_config().num_hidden_layers))
    target, tokenizer, cache, dataset, storage = prepare_features(data_args, training_args, aux_layer_ids)
    target = target.float()  # the drafter trains in fp32 (bf16 autocast via --bf16) against the fp32 LM head
    dataset, held_out = training_split(dataset, training_args, data_args.eval_examples)
    if data_args.init_drafter:
        drafter, coverage = warm_start_drafter(drafter_class, data_args.init_drafter, target, method, dataset,
                                               data_args.num_layers)  # fmt: skip
    else:
        drafter = drafter_class.from_target(target, name_or_path=data_args.target_model,
                                            num_layers=data_args.num_layers, training_method=method, **drafter_config)  # fmt: skip
        coverage = attach_draft_vocab(drafter, dataset, data_args.draft_vocab_size)
    if cache_is_self_distilled(cache) and hasattr(training_args, "greedy_labels"):
        training_args.greedy_labels = True  # answer tokens are the target's greedy choices: no full-head argmax
    trainer = _feature_trainer(trainer_class, drafter, training_args, dataset, held_out, storage, tokenizer)
    resume = training_args.resume_from_checkpoint
    if resume is None and os.path.isdir(training_args.output_dir):
        resume = get_last_checkpoint(training_args.output_dir)  # resume a killed run by default
    if resume:
        print(f"[hf_spec] resuming from {resume}", flush=True)
    result = trainer.train(resume_from_checkpoint=resume)
    if trainer.is_world_process_zero():
        drafter.save_pretrained(training_args.output_dir)
        write_training_summary(trainer, result, method=method, data=asdict(data_args), feature_cache=cache,
                               held_out_examples=data_args.eval_examples, draft_vocab_size=drafter.config.draft_vocab_size,
                               draft_vocab_coverage=coverage, total_wall_s=time.time() - start)  # fmt: skip
        if training_args.push_to_hub:
            trainer.push_to_hub()
    return drafter


def training_runtime(trainer, result) -> dict:
    """A training summary's runtime entries: ``train_runtime_s``, the wall seconds of all runs of a resumed training
    (the trainer's :class:`TrainingClock`; Trainer's own ``train_runtime`` of the last run when it has none), and
    ``train_runtime_note`` when that is a lower bound."""
    clock = next((c for c in trainer.callback_handler.callbacks if isinstance(c, TrainingClock)), None)
    if clock is None:
        return {"train_runtime_s": result.metrics.get("train_runtime")}
    out = {"train_runtime_s": clock.seconds}
    if not clock.complete:
        out["train_runtime_note"] = "a lower bound: resumed from a checkpoint saved without its training clock"
    return out


def write_training_summary(trainer, result, **facts) -> None:
    """``<output_dir>/training_summary.json``: ``facts`` (method, data, held-out examples, draft vocabulary...) and
    what every run records (examples, epochs, the recipe's settings, steps, runtime, final loss, the log history),
    which ``training_scripts/publish_drafter.py`` turns into the model card's training section."""
    args = trainer.args
    summary = {**facts, "examples": len(trainer.train_dataset), "num_train_epochs": args.num_train_epochs,
               "recipe": recipe_settings(args), "global_step": trainer.state.global_step,
               **training_runtime(trainer, result), "final_train_loss": result.training_loss,
               "log_history": trainer.state.log_history}  # fmt: skip
    with open(os.path.join(args.output_dir, "training_summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)


def end_training() -> None:
    """End of a training script: close the process group of a multi-process run (``accelerate launch``), as
    accelerate advises (``Accelerator.end_training``); without it a rank can abort at exit after the last save.
    Nothing to do in a single process."""
    from accelerate import PartialState

    PartialState().destroy_process_group()
