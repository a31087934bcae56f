"""Train a CORAL drafter (Weng et al., 2025): CSRA multi-step training, then the LM-head router.

Stage 1 (``--stage drafter`` or ``both``): the EAGLE architecture trained HASS-style over 3
steps with loss ``0.5·L_reg + 0.1·L_cls + w_csra·L_csra`` at each step t, summed over the steps
(``CoralTrainingArguments``). L_csra is the paper's per-step CSRA: step t's outputs as queries, the
same position's outputs of steps 1..t-1 and the target's feature as positives, InfoNCE at τ 0.07. w_csra is set per target so
that the two logged per-step terms ``reg_weighted`` and ``csra_weighted`` are about equal (App. A).
Saved to ``<output_dir>/drafter``.
Stage 2 (``--stage router`` or ``both``): the drafter frozen, a router over 16 vocabulary
groups (ordered by the training data's assistant-token frequency) trained against the target's
probability mass per group; top-2 groups at inference. Saved, with the drafter, to
``<output_dir>``.

Reproduction of ``drafters/smollm2-135m-instruct-coral``: the shared recipe
``training_scripts/recipes/smollm2_drafters.sh`` (data, budget, settings and results in
drafters/README.md); this script's step is ``METHODS=coral STEPS=train
training_scripts/recipes/smollm2_drafters.sh``.

A killed stage-1 run resumes from its last checkpoint; ``accelerate launch`` runs several processes.
"""

import dataclasses
import os
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from hf_spec.training.pipeline import DataArguments, end_training, train_drafter, train_router
from hf_spec.training.trainers import CoralTrainingArguments, RouterTrainingArguments


@dataclass
class CoralStageArguments:
    stage: str = field(default="both", metadata={"help": "drafter | router | both"})
    router_num_groups: int = field(default=16, metadata={"help": "vocabulary groups N (CORAL: 16)"})
    router_top_n: int = field(default=2, metadata={"help": "groups computed per draft row (CORAL: 2)"})
    router_max_steps: int = field(default=-1, metadata={"help": "router training steps (-1: as stage 1)"})
    router_learning_rate: float | None = field(default=None, metadata={"help": "router lr (default: stage 1's)"})


def main(argv=None):
    parser = HfArgumentParser((DataArguments, CoralStageArguments, CoralTrainingArguments))
    data_args, stage_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    if stage_args.stage not in ("drafter", "router", "both"):
        raise ValueError(f"--stage must be drafter, router or both, got {stage_args.stage!r}")
    final_dir = training_args.output_dir
    drafter_dir = os.path.join(final_dir, "drafter")
    if stage_args.stage in ("drafter", "both"):
        train_drafter("coral", data_args, dataclasses.replace(training_args, output_dir=drafter_dir))
    if stage_args.stage in ("router", "both"):
        shared = {f.name: getattr(training_args, f.name) for f in dataclasses.fields(RouterTrainingArguments)
                  if f.init and hasattr(training_args, f.name) and f.name not in ("feature_noise",)}  # fmt: skip
        shared.update(output_dir=os.path.join(final_dir, "router-checkpoints"), max_steps=stage_args.router_max_steps,
                      router_num_groups=stage_args.router_num_groups, router_top_n=stage_args.router_top_n,
                      learning_rate=stage_args.router_learning_rate or training_args.learning_rate)  # fmt: skip
        router_args = RouterTrainingArguments(**shared)
        drafter = train_router(drafter_dir, data_args, router_args)
        drafter.save_pretrained(final_dir)
    end_training()


if __name__ == "__main__":
    main()
