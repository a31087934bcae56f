"""Train an EAGLE drafter (Li et al., 2024) for a target model on cached target features.

Paper defaults (``EagleTrainingArguments``): AdamW β2 = 0.95, lr 3e-5, 2000 linear warmup steps
then linear decay, grad clip 0.5, batch 4, loss = SmoothL1(features) + 0.1 * CE, U(-0.1, 0.1)
input-feature noise, 1 decoder layer.

Reproduction of ``drafters/smollm2-135m-instruct-eagle`` (2-core CPU, see its README). Changes
for a 135M target and a CPU budget of minutes, all on the command line: lr 1e-3 (33x EAGLE's)
with a 5-step warmup, because 40 steps replace EAGLE's hundreds of thousands; batch 8;
sequences cut to 512 tokens; bf16 autocast (the LM head dominates a CPU step); one thread.
The features file is then passed explicitly so EAGLE and HASS share it::

    export OMP_NUM_THREADS=1   # with other jobs on the 2 cores, 1 thread decoded 50x faster than 2
    python -m hf_spec.training.data self-distill --target_model smollm2-135m-instruct \\
        --dataset sharegpt --num_conversations 320 --stop_after 256 --max_new_tokens 192 \\
        --max_turns 1 --batch_size 32 --output runs/data/sharegpt-sd-smollm2.jsonl
    python -m hf_spec.training.data features --target_model smollm2-135m-instruct \\
        --dataset runs/data/sharegpt-sd-smollm2.jsonl --dtype bfloat16 --max_length 512 \\
        --storage bfloat16 --output runs/features/sd256-512
    python training_scripts/train_eagle.py --target_model smollm2-135m-instruct \\
        --dataset runs/data/sharegpt-sd-smollm2.jsonl --feature_cache runs/features/sd256-512 \\
        --max_length 512 --output_dir runs/eagle --max_steps 40 --per_device_train_batch_size 8 \\
        --learning_rate 1e-3 --warmup_steps 5 --bf16 --use_cpu --logging_steps 5 --save_steps 20

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
