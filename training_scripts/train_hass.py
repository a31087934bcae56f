"""Train a HASS drafter (Zhang et al., 2025) for a target model on cached target features.

HASS = EAGLE's architecture, optimiser and losses (see ``train_eagle.py``) + Top-K
distillation (K = 10, w = 1.0) + 3-step harmonized context alignment with step weights
β^(j-1), β = 1.0 (``HassTrainingArguments``). A step costs about 3 EAGLE steps.

Reproduction of ``drafters/smollm2-135m-instruct-hass`` (2-core CPU, see its README), with the
same data, features, steps and CPU changes as the EAGLE drafter (lr 1e-3, 5 warmup steps,
batch 8, 512 tokens, bf16 autocast, one thread)::

    export OMP_NUM_THREADS=1   # with other jobs on the 2 cores, 1 thread decoded 50x faster than 2
    python -m hf_spec.training.data self-distill --target_model smollm2-135m-instruct \\
        --dataset sharegpt --num_conversations 320 --stop_after 256 --max_new_tokens 192 \\
        --max_turns 1 --batch_size 32 --output runs/data/sharegpt-sd-smollm2.jsonl
    python -m hf_spec.training.data features --target_model smollm2-135m-instruct \\
        --dataset runs/data/sharegpt-sd-smollm2.jsonl --dtype bfloat16 --max_length 512 \\
        --storage bfloat16 --output runs/features/sd256-512
    python training_scripts/train_hass.py --target_model smollm2-135m-instruct \\
        --dataset runs/data/sharegpt-sd-smollm2.jsonl --feature_cache runs/features/sd256-512 \\
        --max_length 512 --output_dir runs/hass --max_steps 40 --per_device_train_batch_size 8 \\
        --learning_rate 1e-3 --warmup_steps 5 --bf16 --use_cpu --logging_steps 5 --save_steps 20

Several processes: ``accelerate launch --multi_gpu --num_processes 2 training_scripts/train_hass.py ...``
(``--multi_gpu`` also on CPU-only machines: accelerate then starts gloo DDP processes).
A killed run resumes from the last checkpoint in ``--output_dir``.
"""

from transformers import HfArgumentParser

from hf_spec.training.pipeline import DataArguments, train_drafter
from hf_spec.training.trainers import HassTrainingArguments


def main(argv=None):
    parser = HfArgumentParser((DataArguments, HassTrainingArguments))
    data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    train_drafter("hass", data_args, training_args)


if __name__ == "__main__":
    main()
