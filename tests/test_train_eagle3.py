"""EAGLE-3 training on the shared pipeline: the feature cache extended with the fused target layers
(named apart, a clear error for caches without them), the training-time test against speculators'
own EAGLE-3 forward, and train_eagle3's run end to end (loss falls, the checkpoint loads and decodes
losslessly)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import hf_spec
from conftest import make_target, plain_generate, random_prompt
from hf_spec.training.collators import FeatureCollator
from hf_spec.training.data import AUX_COLUMN, add_layer_features, build_feature_cache, layer_cache_dir, load_feature_cache
from hf_spec.training.losses import hass_loss, shift_for_drafter
from test_training import _conversations, tiny_chat_tokenizer

LAYERS = 8
FUSED = [2, 4, 5]


def fused_features(target, ids, layer_ids=FUSED):
    with torch.no_grad():
        hidden = target.base_model(input_ids=ids, output_hidden_states=True).hidden_states
    return torch.cat([hidden[i] for i in layer_ids], dim=-1)


def test_cache_gains_the_fused_layers_under_their_own_name(tmp_path):
    target = make_target(num_hidden_layers=LAYERS)
    base = build_feature_cache(target, tiny_chat_tokenizer(), _conversations(12), str(tmp_path / "features"),
                               max_length=48, storage="float32", shard_examples=5)  # fmt: skip
    with pytest.raises(ValueError, match=r"holds only the target's last hidden state.*layers \[2, 4, 5\].*add_layer_features"):
        load_feature_cache(base, FUSED)
    extended = add_layer_features(base, target, [5, 2, 4])
    assert extended == layer_cache_dir(base, FUSED) and extended.endswith("features+layers-2-4-5")
    meta = json.loads(Path(extended, "hf_spec_features.json").read_text())
    assert meta["aux_hidden_state_layer_ids"] == FUSED and meta["base_cache"] == str(Path(base).resolve())
    with pytest.raises(ValueError, match=r"holds the inputs of target layers \[2, 4, 5\]"):
        load_feature_cache(extended, [1, 4, 6])
    plain, _ = load_feature_cache(base)
    dataset, storage = load_feature_cache(extended, FUSED)
    assert AUX_COLUMN not in plain.column_names and len(dataset) == len(plain) == 12
    for k in (0, 7, 11):
        example = dataset.with_format("numpy")[k]
        batch = FeatureCollator(storage=storage)([example])
        old = FeatureCollator(storage=storage)([plain.with_format("numpy")[k]])
        assert torch.equal(batch["hidden_states"], old["hidden_states"]) and torch.equal(batch["input_ids"], old["input_ids"])
        torch.testing.assert_close(batch[AUX_COLUMN], fused_features(target, batch["input_ids"]), rtol=1e-5, atol=1e-5)
    # the trainer names the missing column too
    from hf_spec.training.trainers import Eagle3Trainer, _drafter_inputs

    with pytest.raises(ValueError, match="aux_hidden_states.*add_layer_features"):
        _drafter_inputs(type("T", (), {"input_features": Eagle3Trainer.input_features})(), old)


def test_extended_cache_refuses_shards_of_an_older_base_cache(tmp_path):
    """add_layer_features resumes shard by shard; a base cache rebuilt in place over other conversations
    must not reuse the extended shards of the old one, and a stray non-shard name is not a shard."""
    target = make_target(num_hidden_layers=LAYERS)
    base = build_feature_cache(target, tiny_chat_tokenizer(), _conversations(12), str(tmp_path / "features"),
                               max_length=48, storage="float32", shard_examples=5)  # fmt: skip
    extended = add_layer_features(base, target, FUSED)
    (Path(extended) / "shard-old").mkdir()  # e.g. a user's backup copy: ignored, not parsed as a shard number
    assert add_layer_features(base, target, FUSED) == extended  # same base: every shard reused
    other = [dict(c, id=f"other-{c['id']}") for c in _conversations(12)]
    rebuilt = str(tmp_path / "rebuilt")
    build_feature_cache(target, tiny_chat_tokenizer(), other, rebuilt, max_length=48, storage="float32", shard_examples=5)
    with pytest.raises(ValueError, match="holds other examples.*new output directory"):
        add_layer_features(rebuilt, target, FUSED, output_dir=extended)


def test_training_time_test_equals_speculators_eagle3_forward(tmp_path):
    """Each unrolled step of our EAGLE-3 loss computes what speculators' Eagle3DraftModel computes at that
    training-time-test step: row t of our step j is its anchor t - (j - 1)."""
    pytest.importorskip("speculators", reason="speculators not installed (see tests/test_speculators_export.py)")
    from hf_spec.hub import export
    from test_speculators_export import load_with_speculators, speculators_step_logits, target_and_drafter

    target, drafter = target_and_drafter(tmp_path, "llama", draft_size=48)
    export.export_speculators(drafter, tmp_path / "spec")
    _, model = load_with_speculators(tmp_path / "spec")
    ids = random_prompt(14, seed=3)
    ids_in, fused_in, target_feats, _ = shift_for_drafter(ids, fused_features(target, ids), torch.ones_like(ids))
    last = target.base_model(input_ids=ids).last_hidden_state.detach()
    steps = 3
    out = hass_loss(drafter, ids_in, fused_in, last[:, 1:], None, num_steps=steps, w_reg=0.0, w_topk=0.0,
                    beta=0.8, return_predictions=True, detach_steps=False)  # fmt: skip
    theirs = speculators_step_logits(model, fused_in, ids_in, steps)
    with torch.no_grad():
        for j in range(steps):
            ours = drafter.draft_logits(out["predictions"][j])
            torch.testing.assert_close(ours[:, j:], theirs[j][:, : ids_in.shape[1] - j], rtol=1e-4, atol=1e-4)


def test_gradients_flow_through_the_steps_unless_detached():
    target = make_target(num_hidden_layers=LAYERS)
    drafter = hf_spec.Eagle3Drafter.from_target(target)
    ids = random_prompt(10, seed=2)
    ids_in, fused_in, _, _ = shift_for_drafter(ids, fused_features(target, ids), torch.ones_like(ids))
    last = target.base_model(input_ids=ids).last_hidden_state.detach()[:, 1:]
    grads = {}
    for detach in (True, False):
        drafter.zero_grad()
        out = hass_loss(drafter, ids_in, fused_in, last, None, num_steps=2, w_reg=0.0, w_topk=0.0, detach_steps=detach)
        out["loss"].backward()
        grads[detach] = drafter.fc.weight.grad.clone()
    # fc runs in step 1 only: with detached steps it learns from the step-2 loss only through the KV cache
    assert not torch.allclose(grads[True], grads[False])


SCRIPT = Path(__file__).parents[1] / "training_scripts" / "train_eagle3.py"


def script_run(tmp_path, max_steps: int, batch: int = 8) -> tuple:
    """(target, arguments of a train_eagle3.py run on a tiny Llama target saved with a chat tokenizer)."""
    target = make_target(num_hidden_layers=LAYERS)
    target_dir = tmp_path / "target"
    target.save_pretrained(target_dir)
    tiny_chat_tokenizer().save_pretrained(target_dir)
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in _conversations(32)))
    return target, [
        "--target_model", str(target_dir), "--dataset", str(data), "--feature_cache", str(tmp_path / "cache"),
        "--feature_dtype", "float32", "--max_length", "64", "--draft_vocab_size", "24",
        "--output_dir", str(tmp_path / "eagle3"), "--max_steps", str(max_steps), "--learning_rate", "3e-3",
        "--warmup_steps", "2", "--per_device_train_batch_size", str(batch), "--hass_steps", "3", "--logging_steps", "1",
        "--save_strategy", "no", "--use_cpu", "--seed", "0", "--disable_tqdm", "true", "--report_to", "none",
    ]  # fmt: skip


def test_train_eagle3_script_trains_and_the_checkpoint_decodes_losslessly(tmp_path):
    import sys

    sys.path.insert(0, str(SCRIPT.parent))
    import train_eagle3

    target, argv = script_run(tmp_path, max_steps=40)
    out_dir = tmp_path / "eagle3"
    train_eagle3.main(argv)
    assert (tmp_path / "cache+layers-2-4-5" / "hf_spec_features.json").exists()
    summary = json.loads((out_dir / "training_summary.json").read_text())
    losses = [r["loss"] for r in summary["log_history"] if "loss" in r]
    assert summary["method"] == "eagle3" and len(losses) >= 30
    recipe = summary["recipe"]  # what the model card states: the training-time test depth as run, EAGLE-3's loss
    assert recipe["hass_steps"] == 3 and recipe["w_reg"] == 0.0 and recipe["learning_rate"] == 3e-3
    assert "output_dir" not in recipe and "logging_steps" not in recipe
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5, losses

    drafter = hf_spec.Eagle3Drafter.from_pretrained(out_dir)
    assert drafter.config.training_method == "eagle3" and drafter.config.draft_vocab_size == 24
    assert drafter.config.eagle_aux_hidden_state_layer_ids == FUSED
    target = target.float()
    accepted = []
    for seed in (1, 2):
        prompt = random_prompt(8, vocab_size=40, seed=seed)
        plain = plain_generate(target, prompt, max_new_tokens=24, do_sample=False)
        ours = target.generate(prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False)
        assert torch.equal(ours, plain)
        accepted += drafter.last_generation_stats.accepted_lengths
    assert len(accepted) > 0


def test_train_eagle3_under_accelerate_launch_two_processes(tmp_path):
    """Two CPU processes (gloo DDP): the unrolled steps run the drafter's forward several times per backward and
    its own head is trained, so every trained parameter must be used inside the forward (else DDP marks a
    gradient ready twice); the extended cache is made once, by the main process."""
    import os
    import subprocess
    import sys

    _, argv = script_run(tmp_path, max_steps=3, batch=4)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
           "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(SCRIPT), *argv]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(SCRIPT.parents[1]), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=500)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "eagle3" / "training_summary.json").read_text())
    assert summary["global_step"] == 3 and summary["feature_cache"].endswith("cache+layers-2-4-5")
    assert hf_spec.Eagle3Drafter.from_pretrained(tmp_path / "eagle3").config.draft_vocab_size == 24
