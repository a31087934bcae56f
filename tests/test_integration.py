"""Integration on the real packaged SmolLM2-135M-Instruct (fp32): losslessness on a real model."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModel

import hf_spec
from conftest import plain_generate
from hf_spec.demo import DEFAULT_TARGET, shipped_drafter_path
from hf_spec.resources import MissingPackageError, install_command, package_dir

pytestmark = pytest.mark.integration

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
]


@pytest.fixture(scope="module")
def smollm2():
    entry = hf_spec.PACKAGED_MODELS[DEFAULT_TARGET]
    try:
        package_dir(entry.packages[0])
    except MissingPackageError:
        pytest.skip(f"SmolLM2 package missing: {install_command(entry.packages)}")
    model, tokenizer = hf_spec.load_packaged_model(DEFAULT_TARGET, dtype=torch.float32)
    encoded = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        for p in PROMPTS
    ]  # fmt: skip
    return model, encoded


def test_untrained_drafter_is_still_lossless_on_smollm2(smollm2):
    model, encoded = smollm2
    drafter = hf_spec.EagleDrafter.from_target(model, name_or_path=DEFAULT_TARGET)
    ids = encoded[0]
    expected = plain_generate(model, ids, max_new_tokens=24, do_sample=False)
    out = model.generate(ids, assistant_model=drafter, max_new_tokens=24, do_sample=False)
    assert torch.equal(out, expected)


def test_shipped_drafter_is_lossless_and_accepted_on_smollm2(smollm2):
    path = shipped_drafter_path(DEFAULT_TARGET)
    if path is None:
        pytest.skip("no trained drafter ships yet")
    model, encoded = smollm2
    drafter = hf_spec.EagleDrafter.from_pretrained(path)
    taus = []
    for ids in encoded:
        expected = plain_generate(model, ids, max_new_tokens=48, do_sample=False)
        out = model.generate(ids, assistant_model=drafter, max_new_tokens=48, do_sample=False)
        assert torch.equal(out, expected)  # as shipped: n-gram branches, the cost gate
        out = model.generate(ids, assistant_model=drafter, max_new_tokens=48, do_sample=False, ngram_nodes=0)
        assert torch.equal(out, expected)
        taus.append(drafter.last_generation_stats.tau)  # the drafter's own trees
    assert sum(taus) / len(taus) > 1.2, taus  # an untrained drafter gets ~1.0 here


SHIPPED = sorted(p.name for p in (Path(__file__).parents[1] / "drafters").glob(f"{DEFAULT_TARGET}-*"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_drafter_loads_with_automodel_and_is_lossless(smollm2, name):
    """Each committed drafter family (EAGLE, HASS, ParallelSpec, CORAL...) on the real model, fp32."""
    model, encoded = smollm2
    drafter = AutoModel.from_pretrained(Path(__file__).parents[1] / "drafters" / name, dtype=torch.float32)
    assert isinstance(drafter, hf_spec.SpecDrafterModel)
    ids = encoded[1]
    expected = plain_generate(model, ids, max_new_tokens=32, do_sample=False)
    out = model.generate(ids, assistant_model=drafter, max_new_tokens=32, do_sample=False)
    assert torch.equal(out, expected)  # as shipped: n-gram branches, the cost gate
    out = model.generate(ids, assistant_model=drafter, max_new_tokens=32, do_sample=False, ngram_nodes=0)
    assert torch.equal(out, expected)
    assert drafter.last_generation_stats.tau > 1.1  # its own drafts are accepted: the weights are trained ones


def test_shipped_drafter_batch_equals_per_row_plain_on_smollm2(smollm2):
    """Two prompts of different lengths, left-padded, in one batched call (fp32): each row == its plain run."""
    path = shipped_drafter_path(DEFAULT_TARGET)
    model, encoded = smollm2
    drafter = hf_spec.EagleDrafter.from_pretrained(path) if path else hf_spec.EagleDrafter.from_target(model)
    width = max(ids.shape[1] for ids in encoded)
    pad = model.generation_config.pad_token_id
    assert pad is not None  # SmolLM2 ships one; transformers pads finished rows with it
    batch = torch.full((len(encoded), width), pad, dtype=torch.long)
    mask = torch.zeros_like(batch)
    for row, ids in enumerate(encoded):
        batch[row, width - ids.shape[1] :] = ids[0]
        mask[row, width - ids.shape[1] :] = 1
    out = model.generate(batch, attention_mask=mask, assistant_model=drafter, max_new_tokens=32, do_sample=False)
    for row, ids in enumerate(encoded):
        expected = plain_generate(model, ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1] :]
        got = out[row, width:]
        assert torch.equal(got[: expected.numel()], expected)
        assert bool((got[expected.numel() :] == pad).all())  # a row that stopped early is padded
