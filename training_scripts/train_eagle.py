"""Train an EAGLE drafter (Li et al., 2024) for a target model on cached target features.

Paper defaults (``EagleTrainingArguments``): AdamW β2 = 0.95, lr 3e-5, 2000 linear warmup steps
then linear decay, grad clip 0.5, batch 4, loss = SmoothL1(features) + 0.1 * CE, U(-0.1, 0.1)
input-feature noise, 1 decoder layer.

Reproduction of ``drafters/smollm2-135m-instruct-eagle`` (2-core CPU, see its README). Changes
for a 135M target and a ~20-minute CPU budget, all on the command line: a 10x larger lr
(3e-4) and a 50-step warmup, since ~1k steps replace EAGLE's ~hundreds of thousands; sequences
cut to 512 tokens; bf16 autocast; one thread (OMP_NUM_THREADS=1 is much faster on a shared box)::

    python -m hf_spec.training.data self-distill --target_model smollm2-135m-instruct \\
        --dataset sharegpt --num_conversations 320 --max_new_tokens 192 --max_turns 1 \\
        --batch_size 32 --output runs/data/sharegpt-sd-smollm2.jsonl
    OMP_NUM_THREADS=1 python training_scripts/train_eagle.py --target_model smollm2-135m-instruct \\
        --dataset runs/data/sharegpt-sd-smollm2.jsonl --max_length 512 --output_dir runs/eagle \\
        --max_steps 600 --learning_rate 3e-4 --warmup_steps 50 --bf16 --use_cpu \\
        --logging_steps 20 --save_steps 200

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
