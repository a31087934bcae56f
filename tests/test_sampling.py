"""Sampling with a drafter must keep the target's distribution exactly.

We enumerate the target's exact joint distribution of the first new tokens on a 16-token
vocabulary and run a chi-square goodness-of-fit test on samples drawn through
``target.generate(assistant_model=drafter, do_sample=True)``. Seeds are fixed, so each test
is deterministic; the negative control shows the test rejects a distribution that is off.
"""

import itertools

import pytest
import torch
from scipy import stats as scipy_stats
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import hf_spec
from conftest import make_target, random_prompt, train_drafter_on_outputs

VOCAB = 16
NEW_TOKENS = 3
SAMPLES = 1500
P_VALUE_FLOOR = 1e-3


def warpers(temperature=1.0, top_k=None, top_p=None):
    chain = [TemperatureLogitsWarper(temperature)]
    if top_k is not None:
        chain.append(TopKLogitsWarper(top_k))
    if top_p is not None:
        chain.append(TopPLogitsWarper(top_p))
    return LogitsProcessorList(chain)


@torch.no_grad()
def exact_joint(target, prompt, processors, new_tokens=NEW_TOKENS):
    """Exact probability of every continuation of ``new_tokens`` tokens: (V,)*new_tokens tensor."""
    joint = torch.ones(1)
    contexts = prompt
    for _ in range(new_tokens):
        logits = target(contexts).logits[:, -1].float()
        probs = torch.softmax(processors(contexts, logits), dim=-1)  # (rows, V)
        joint = (joint.view(-1, 1) * probs).view(-1)
        contexts = torch.cat(
            [contexts.repeat_interleave(VOCAB, dim=0), torch.arange(VOCAB).repeat(contexts.shape[0]).view(-1, 1)], 1
        )
    return joint.view(*([VOCAB] * new_tokens))


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Goodness of fit of ``counts`` to ``probs``; cells with small expectation pooled into one."""
    counts, probs = counts.reshape(-1).double(), probs.reshape(-1).double()
    n = counts.sum()
    expected = probs * n
    big = expected >= min_expected
    observed = torch.cat([counts[big], counts[~big].sum().view(1)])
    expected = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = expected > 0
    if bool((observed[~keep] > 0).any()):
        return 0.0  # a sample the target can never produce
    observed, expected = observed[keep], expected[keep]
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return float(scipy_stats.chi2.sf(statistic, df=int(observed.numel()) - 1))


def sample_counts(target, prompt, drafter, samples=SAMPLES, **gen_kwargs):
    counts = torch.zeros([VOCAB] * NEW_TOKENS)
    taus = []
    for _ in range(samples):
        gen_kwargs.setdefault("top_k", None)  # transformers' default top_k=50 is a no-op on 16 tokens anyway
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=NEW_TOKENS, do_sample=True, **gen_kwargs)
        counts[tuple(out[0, prompt.shape[1]:].tolist())] += 1
        if drafter.last_generation_stats.cycles:
            taus.append(drafter.last_generation_stats.tau)
    return counts, sum(taus) / max(len(taus), 1)


def sampled_law_p_value(target, prompt, drafter, warp, seed=1234, **tree):
    """(chi-square p-value of the drafter's sampled next tokens against the exact target law under
    ``warp``, mean τ): ``SAMPLES`` generations from ``torch.manual_seed(seed)``."""
    exact = exact_joint(target, prompt, warpers(**warp))
    torch.manual_seed(seed)
    counts, tau = sample_counts(target, prompt, drafter, **tree, **warp)
    return chi_square_pvalue(counts, exact), tau


_PAIR = {}


def tiny_pair(kind):
    if kind not in _PAIR:
        target = make_target("llama", vocab_size=VOCAB, logit_scale=8.0, seed=3)
        drafter = hf_spec.EagleDrafter.from_target(target)
        if kind == "trained":
            train_drafter_on_outputs(target, drafter, do_sample=True, steps=300)
        _PAIR[kind] = (target, drafter)
    return _PAIR[kind]


CASES = [  # (drafter, tree shape (depth, top_k, total), warper kwargs)
    ("trained", (4, 4, 12), dict(temperature=1.0)),
    ("trained", (4, 4, 12), dict(temperature=0.7)),
    ("trained", (4, 1, 4), dict(temperature=1.0)),
    ("trained", (3, 3, 6), dict(temperature=0.7, top_p=0.8)),
    ("random", (3, 4, 8), dict(temperature=1.0, top_k=5)),
    ("random", (3, 1, 3), dict(temperature=0.7, top_p=0.9)),
    ("trained", (4, 4, 12, 0.1), dict(temperature=1.0)),  # tree_min_prob: confidence-sized trees
]


@pytest.mark.parametrize("kind,shape,warp", CASES, ids=[f"{c[0]}-d{c[1][0]}k{c[1][1]}{'-floor' if len(c[1]) > 3 else ''}-{c[2]}" for c in CASES])
def test_sampled_distribution_equals_target(kind, shape, warp):
    target, drafter = tiny_pair(kind)
    prompt = random_prompt(length=6, vocab_size=VOCAB, seed=11)
    depth, top_k, total, *floor = shape
    p_value, tau = sampled_law_p_value(target, prompt, drafter, warp, tree_depth=depth, tree_top_k=top_k,
                                       tree_total_tokens=total, tree_min_prob=floor[0] if floor else None)  # fmt: skip
    assert p_value > P_VALUE_FLOOR, (p_value, tau)
    if kind == "trained":
        assert tau > 1.5  # drafts are really accepted, so the accept path is exercised


def test_chi_square_rejects_a_slightly_wrong_distribution():
    """Negative control: samples from T=1.0 are told apart from the exact T=0.85 distribution."""
    target, _ = tiny_pair("random")
    prompt = random_prompt(length=6, vocab_size=VOCAB, seed=11)
    right = exact_joint(target, prompt, warpers(temperature=1.0))
    wrong = exact_joint(target, prompt, warpers(temperature=0.85))
    g = torch.Generator().manual_seed(0)
    draws = torch.multinomial(right.view(-1), SAMPLES, replacement=True, generator=g)
    counts = torch.bincount(draws, minlength=right.numel()).float()
    assert chi_square_pvalue(counts, right) > P_VALUE_FLOOR
    assert chi_square_pvalue(counts, wrong) < P_VALUE_FLOOR


def test_rejection_sampling_step_is_exact_by_enumeration():
    """One node, pruned and kept candidates: the emitted token's law, computed exactly, is p."""
    from hf_spec.verify import _rejection_sample

    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    q = torch.tensor([0.1, 0.4, 0.3, 0.1, 0.1])
    torch.manual_seed(0)
    counts = torch.zeros(5)
    n = 20000
    for _ in range(n):
        # two candidates drawn without replacement from q; the second one "pruned" (node -1)
        first = int(torch.multinomial(q, 1))
        rest = q.clone()
        rest[first] = 0
        second = int(torch.multinomial(rest / rest.sum(), 1))
        token, _ = _rejection_sample(p, q, torch.tensor([first, second]), torch.tensor([1, -1]), None)
        counts[token] += 1
    assert chi_square_pvalue(counts, p) > P_VALUE_FLOOR
