"""Integration on the real packaged SmolLM2-135M-Instruct (fp32): losslessness on a real model."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModel

import hf_spec
from conftest import plain_generate
from hf_spec.demo import DEFAULT_TARGET, shipped_drafter_path

pytestmark = pytest.mark.integration

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
]


@pytest.fixture(scope="module")
def prompts(smollm2):
    """(the session's shared fp32 SmolLM2 (conftest), :data:`PROMPTS` encoded with its chat template)."""
    model, tokenizer = smollm2
    encoded = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        for p in PROMPTS
    ]  # fmt: skip
    return model, encoded


LONGEST = 48
_PLAIN: dict[tuple, torch.Tensor] = {}


def plain_greedy(model, ids, max_new_tokens: int) -> torch.Tensor:
    """Plain greedy ``generate()`` of ``ids`` up to ``max_new_tokens`` (<= :data:`LONGEST`): one plain run of
    LONGEST tokens per prompt for the whole module, cut to length (greedy runs of different lengths share their
    start; a run that stopped at EOS earlier is the same in both)."""
    assert max_new_tokens <= LONGEST
    key = tuple(ids[0].tolist())
    if key not in _PLAIN:
        _PLAIN[key] = plain_generate(model, ids, max_new_tokens=LONGEST, do_sample=False)
    return _PLAIN[key][:, : ids.shape[1] + max_new_tokens]


def test_untrained_drafter_is_still_lossless_on_smollm2(prompts):
    model, encoded = prompts
    drafter = hf_spec.EagleDrafter.from_target(model, name_or_path=DEFAULT_TARGET)
    ids = encoded[0]
    expected = plain_greedy(model, ids, 24)
    out = model.generate(ids, assistant_model=drafter, max_new_tokens=24, do_sample=False)
    assert torch.equal(out, expected)


def test_shipped_drafter_is_lossless_and_accepted_on_smollm2(prompts):
    path = shipped_drafter_path(DEFAULT_TARGET)
    if path is None:
        pytest.skip("no trained drafter ships yet")
    model, encoded = prompts
    drafter = hf_spec.EagleDrafter.from_pretrained(path)
    taus = []
    for ids in encoded:
        expected = plain_greedy(model, ids, 48)
        out = model.generate(ids, assistant_model=drafter, max_new_tokens=48, do_sample=False)
        assert torch.equal(out, expected)  # as shipped: n-gram branches, the cost gate
        out = model.generate(ids, assistant_model=drafter, max_new_tokens=48, do_sample=False, ngram_nodes=0)
        assert torch.equal(out, expected)
        taus.append(drafter.last_generation_stats.tau)  # the drafter's own trees
    assert sum(taus) / len(taus) > 1.2, taus  # an untrained drafter gets ~1.0 here


SHIPPED = sorted(p.name for p in (Path(__file__).parents[1] / "drafters").glob(f"{DEFAULT_TARGET}-*"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_drafter_loads_with_automodel_and_is_lossless(prompts, name):
    """Each committed drafter family (EAGLE, HASS, ParallelSpec, CORAL...) on the real model, fp32."""
    model, encoded = prompts
    drafter = AutoModel.from_pretrained(Path(__file__).parents[1] / "drafters" / name, dtype=torch.float32)
    assert isinstance(drafter, hf_spec.SpecDrafterModel)
    ids = encoded[1]
    expected = plain_greedy(model, ids, 32)
    out = model.generate(ids, assistant_model=drafter, max_new_tokens=32, do_sample=False)
    assert torch.equal(out, expected)  # as shipped: n-gram branches, the cost gate
    out = model.generate(ids, assistant_model=drafter, max_new_tokens=32, do_sample=False, ngram_nodes=0)
    assert torch.equal(out, expected)
    assert drafter.last_generation_stats.tau > 1.1  # its own drafts are accepted: the weights are trained ones


def test_shipped_drafter_batch_equals_per_row_plain_on_smollm2(prompts):
    """Two prompts of different lengths, left-padded, in one batched call (fp32): each row == its plain run."""
    path = shipped_drafter_path(DEFAULT_TARGET)
    model, encoded = prompts
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
        expected = plain_greedy(model, ids, 32)[0, ids.shape[1] :]
        got = out[row, width:]
        assert torch.equal(got[: expected.numel()], expected)
        assert bool((got[expected.numel() :] == pad).all())  # a row that stopped early is padded
