"""Property-based check: greedy fp32 tree decoding equals plain generate() for random
targets (Llama/Qwen2/Mistral, random sizes) x random drafters x random tree shapes x prompts.

The default suite runs a small sample; ``pytest -m slow tests/test_properties.py`` runs the
larger sweep (its count is recorded in the closing notes of the robustness issue).
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hf_spec
from conftest import make_target, plain_generate

cases = st.fixed_dictionaries(
    {
        "family": st.sampled_from(["llama", "qwen2", "mistral"]),
        "heads": st.sampled_from([(2, 1), (4, 2), (4, 4)]),
        "head_dim": st.sampled_from([8, 16]),
        "layers": st.integers(1, 3),
        "vocab": st.integers(20, 300),
        "logit_scale": st.sampled_from([1.0, 10.0, 40.0]),
        "depth": st.integers(1, 7),
        "top_k": st.integers(1, 10),
        "total": st.integers(1, 70),
        "prompt_length": st.integers(1, 20),
        "new_tokens": st.integers(1, 40),
        "seed": st.integers(0, 10_000),
    }
)


def check_case(case):
    heads, kv_heads = case["heads"]
    hidden = heads * case["head_dim"]
    target = make_target(
        case["family"],
        vocab_size=case["vocab"],
        seed=case["seed"],
        logit_scale=case["logit_scale"],
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_hidden_layers=case["layers"],
    )
    drafter = hf_spec.EagleDrafter.from_target(target)
    g = torch.Generator().manual_seed(case["seed"])
    prompt = torch.randint(1, case["vocab"], (1, case["prompt_length"]), generator=g)
    expected = plain_generate(target, prompt, max_new_tokens=case["new_tokens"], do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=case["new_tokens"], do_sample=False,
                          tree_depth=case["depth"], tree_top_k=case["top_k"], tree_total_tokens=case["total"])  # fmt: skip
    assert torch.equal(out, expected), case


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(cases)
def test_greedy_equals_plain_generate(case):
    check_case(case)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_greedy_equals_plain_generate_sweep(case):
    check_case(case)
