"""Train a ParallelSpec drafter (EAGLE-ParallelSpec, k = 4 [MASK] tokens, group size 5) for a target.

Same data pipeline and feature cache as ``train_eagle.py``/``train_hass.py`` (chat-templated
conversations, loss on assistant tokens, target features cached once). The loss is
EAGLE-Parallel: the EAGLE loss summed over the k + 1 positions of every parallel group, with
the group-wise attention mask of Fig. 3 (``hf_spec.training.parallelspec``). Paper defaults (A.2):
AdamW β = (0.9, 0.95), lr 5e-5, no weight decay, global batch 32 (4 per device x 8
accumulation here), 40 epochs; as in Fig. 3, a parallel group follows every position that has
a label (``--parallel_group_density 1.0``; a row of P pairs becomes ~P·(k+1) positions; a
smaller density keeps that fraction of the groups, drawn per batch). ``--num_parallel_groups G``
selects the older sparse setting (G random groups per row) instead. The trainer logs the
teacher-forced top-1 per depth (``top1_d0`` the next token .. ``top1_d4`` the last [MASK]).

Reproduction of ``drafters/smollm2-135m-instruct-parallelspec``: the shared recipe
``training_scripts/recipes/smollm2_drafters.sh`` (data, budget, settings and results in
drafters/README.md); this script's step is ``METHODS=parallelspec STEPS=train
training_scripts/recipes/smollm2_drafters.sh``. That drafter was trained with the older sparse
setting (4 groups per row, now ``--num_parallel_groups 4``).

A killed run resumes from the last checkpoint in ``--output_dir``; ``accelerate launch`` runs
several processes.
"""

from dataclasses import dataclass, field

from transformers import HfArgumentParser

from hf_spec.training.parallelspec import ParallelTrainingArguments
from hf_spec.training.pipeline import DataArguments, end_training, train_drafter


@dataclass
class ParallelDrafterArguments:
    num_mask_tokens: int = field(default=4, metadata={"help": "k [MASK] tokens (paper: 4, parallel group size 5)"})
    tree_widths: str = field(default="4,2,2,1,1", metadata={"help": "default static tree widths per depth (A.3)"})


def main(argv=None):
    parser = HfArgumentParser((DataArguments, ParallelDrafterArguments, ParallelTrainingArguments))
    data_args, drafter_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    widths = [int(w) for w in drafter_args.tree_widths.split(",")]
    train_drafter("parallelspec", data_args, training_args, num_mask_tokens=drafter_args.num_mask_tokens,
                  tree_widths=widths)  # fmt: skip
    end_training()


if __name__ == "__main__":
    main()
