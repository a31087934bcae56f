"""Train a HASS drafter (Zhang et al., 2025) for a target model on cached target features.

HASS = EAGLE's architecture, optimiser and losses (see ``train_eagle.py``) + Top-K
distillation (K = 10, w = 1.0) + 3-step harmonized context alignment with step weights
β^(j-1), β = 1.0 (``HassTrainingArguments``). A step costs about 3 EAGLE steps.

Reproduction of ``drafters/smollm2-135m-instruct-hass``: the shared recipe
``training_scripts/recipes/smollm2_drafters.sh`` (data, budget, settings and results in
drafters/README.md); this script's step is ``METHODS=hass STEPS=train
training_scripts/recipes/smollm2_drafters.sh``.

Several processes: ``accelerate launch --multi_gpu --num_processes 2 training_scripts/train_hass.py ...``
(``--multi_gpu`` also on CPU-only machines: accelerate then starts gloo DDP processes).
A killed run resumes from the last checkpoint in ``--output_dir``.
"""

from transformers import HfArgumentParser

from hf_spec.training.pipeline import DataArguments, end_training, train_drafter
from hf_spec.training.trainers import HassTrainingArguments


def main(argv=None):
    parser = HfArgumentParser((DataArguments, HassTrainingArguments))
    data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    train_drafter("hass", data_args, training_args)
    end_training()


if __name__ == "__main__":
    main()
