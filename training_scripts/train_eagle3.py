"""Train an EAGLE-3 drafter (Li et al., 2025) for a target model on cached target features.

EAGLE-3 = one decoder layer over the fusion of three target layers (default (2, L//2, L-3): the
inputs of those layers, HF ``hidden_states[i]``), its own head over the draft vocabulary
(``--draft_vocab_size``, 8192 by default, as the other scripts), and the training-time test: the
drafter is unrolled 7 drafting depths on every sequence, each depth seeing its decoding-time
context, with the cross-entropy to the target's distribution at each depth weighted 0.8^(j-1)
(``Eagle3TrainingArguments``; ``--w_topk 1.0`` adds HASS's Top-K distillation on top). Optimiser,
schedule and batch are the shared EAGLE recipe's.

Same data as ``train_hass.py``: the same ``--dataset`` / ``--feature_cache`` (a self-distilled one
included). That cache holds the target's last hidden state (the targets); the fused layers are added
once to a copy beside it (``CACHE+layers-2-15-27`` for SmolLM2-135M), which later runs reuse
(``python -m hf_spec.training.data layers`` makes it ahead of time).

On the shipped drafters' data and settings: ``METHODS=eagle3 STEPS=train
training_scripts/recipes/smollm2_drafters.sh`` (``drafters/smollm2-135m-instruct-eagle3``: ``EPOCHS=2``, 3 unrolled
depths, what a 2-core CPU affords; ``TTT_STEPS=7`` unrolls EAGLE-3's 7).

The result exports to vLLM's speculators format: ``hf_spec.hub.export.export_speculators(drafter, "out/")``.

Several processes: ``accelerate launch --multi_gpu --num_processes 2 training_scripts/train_eagle3.py ...``.
A killed run resumes from the last checkpoint in ``--output_dir``.
"""

from dataclasses import dataclass, field

from transformers import HfArgumentParser

from hf_spec.training.pipeline import DataArguments, end_training, train_drafter
from hf_spec.training.trainers import Eagle3TrainingArguments


@dataclass
class Eagle3Arguments:
    """The EAGLE-3 drafter's own choices."""

    eagle_aux_hidden_state_layer_ids: list[int] | None = field(default=None, metadata={
        "help": "target layers whose inputs are fused (default: EAGLE-3's 2, L//2, L-3)"})  # fmt: skip
    norm_before_residual: bool = field(default=False, metadata={
        "help": "the attention residual is hidden_norm(h) instead of h (a speculators option; EAGLE-3: no)"})  # fmt: skip


def main(argv=None):
    parser = HfArgumentParser((DataArguments, Eagle3TrainingArguments, Eagle3Arguments))
    data_args, training_args, eagle3_args = parser.parse_args_into_dataclasses(args=argv)
    train_drafter("eagle3", data_args, training_args, eagle_aux_hidden_state_layer_ids=eagle3_args.eagle_aux_hidden_state_layer_ids,
                  norm_before_residual=eagle3_args.norm_before_residual)  # fmt: skip
    end_training()


if __name__ == "__main__":
    main()
