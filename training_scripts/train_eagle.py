"""Train an EAGLE drafter (Li et al., 2024) for a target model on cached target features.

Paper defaults (``EagleTrainingArguments``): AdamW β2 = 0.95, lr 3e-5, 2000 linear warmup steps
then linear decay, grad clip 0.5, batch 4, loss = SmoothL1(features) + 0.1 * CE, U(-0.1, 0.1)
input-feature noise, 1 decoder layer.

Reproduction of ``drafters/smollm2-135m-instruct-eagle``: the shared recipe
``training_scripts/recipes/smollm2_drafters.sh`` (data, budget, settings and results in
drafters/README.md); this script's step is ``METHODS=eagle STEPS=train
training_scripts/recipes/smollm2_drafters.sh``.

Several processes: ``accelerate launch --multi_gpu --num_processes 2 training_scripts/train_eagle.py ...``
(``--multi_gpu`` also on CPU-only machines: accelerate then starts gloo DDP processes).
A killed run resumes from the last checkpoint in ``--output_dir`` when restarted with the same
command. ``--push_to_hub --hub_model_id you/name`` uploads the drafter.
"""

from transformers import HfArgumentParser

from hf_spec.training.pipeline import DataArguments, end_training, train_drafter
from hf_spec.training.trainers import EagleTrainingArguments


def main(argv=None):
    parser = HfArgumentParser((DataArguments, EagleTrainingArguments))
    data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    train_drafter("eagle", data_args, training_args)
    end_training()


if __name__ == "__main__":
    main()
