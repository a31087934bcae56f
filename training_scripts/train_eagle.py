"""Train an EAGLE drafter (Li et al., 2024) for a target model on cached target features.

Paper defaults (``EagleTrainingArguments``): AdamW β2 = 0.95, lr 3e-5, 2000 linear warmup steps
then linear decay, grad clip 0.5, batch 4, loss = SmoothL1(features) + 0.1 * CE, U(-0.1, 0.1)
input-feature noise, 1 decoder layer.

Reproduction of ``drafters/smollm2-135m-instruct-eagle`` (2-core CPU; data, budget and results in
drafters/README.md; every drafter there shares the data and budget; the whole recipe is
``training_scripts/recipes/smollm2_drafters.sh``). Changes for a 135M target and a CPU budget,
all on the command line: lr 5e-4 with 20 warmup steps (the papers' schedules are for 100x more
data), batch 8, sequences <= 512 tokens, one epoch, bf16 autocast::

    python -m hf_spec.training.distill --target_model smollm2-135m-instruct --dataset sharegpt \\
        --num_conversations 3200 --batch_size 64 --shard_examples 128 --threads 1 \\
        --output runs/features/smollm2-sharegpt-distill
    python training_scripts/train_eagle.py --target_model smollm2-135m-instruct --dataset sharegpt \\
        --feature_cache runs/features/smollm2-sharegpt-distill --max_length 512 --num_train_epochs 1 \\
        --per_device_train_batch_size 8 --learning_rate 5e-4 --warmup_steps 20 --bf16 --use_cpu \\
        --logging_steps 10 --save_steps 50 --save_total_limit 2 --report_to none \\
        --output_dir runs/train/eagle

Several processes: ``accelerate launch --multi_gpu --num_processes 2 training_scripts/train_eagle.py ...``
(``--multi_gpu`` also on CPU-only machines: accelerate then starts gloo DDP processes).
A killed run resumes from the last checkpoint in ``--output_dir`` when restarted with the same
command. ``--push_to_hub --hub_model_id you/name`` uploads the drafter.
"""

from transformers import HfArgumentParser

from hf_spec.training.pipeline import DataArguments, train_drafter
from hf_spec.training.trainers import EagleTrainingArguments


def main(argv=None):
    parser = HfArgumentParser((DataArguments, EagleTrainingArguments))
    data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    train_drafter("eagle", data_args, training_args)


if __name__ == "__main__":
    main()
