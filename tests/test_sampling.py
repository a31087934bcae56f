"""Sampling with a drafter must keep the target's distribution exactly.

We enumerate the target's exact joint distribution of the first new tokens on a 16-token
vocabulary and run a chi-square goodness-of-fit test on samples drawn through
``target.generate(assistant_model=drafter, do_sample=True)``. Seeds are fixed, so each test
is deterministic; the negative controls show the test rejects a distribution that is off.

Draws are batched: each ``generate()`` call samples :data:`ROWS` rows of the same prompt (rows sample
independently, each row's law is the target's: ``tests/test_batched.py``), so a test of :data:`SAMPLES`
draws makes ``SAMPLES // ROWS`` calls instead of ``SAMPLES``, with the same statistical power (the same
number of independent draws). Batched rows take the padded-cache path of :mod:`hf_spec.decoding`; one
case here keeps ``rows=1`` for the one-row path, and ``tests/test_sampling_power.py`` (nightly) draws one row
per call. Every test through :func:`sampled_law_p_value` also checks that its own draws are told apart from a
slightly wrong law (15% colder), and :func:`test_a_slightly_wrong_sampler_is_rejected` runs a broken
verification through the same batched draws.
"""

import itertools

import pytest
import torch
from scipy import stats as scipy_stats
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import hf_spec
from conftest import make_target, random_prompt, train_drafter_on_outputs
from hf_spec.attention_kernels import forced_attention
from hf_spec.linear_kernels import KERNELS, forced_kernel

VOCAB = 16
NEW_TOKENS = 3
SAMPLES = 1500
ROWS = 50
"""Draws per ``generate()`` call (rows of one batch): 1500 draws in 30 calls; batching spreads the per-call cost
(transformers' set-up, the target's prefill and verification forwards) over the rows."""
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


def sample_batches(target, prompt, drafter, samples=SAMPLES, rows=ROWS, new_tokens=NEW_TOKENS, **gen_kwargs):
    """(counts of ``samples`` sampled ``new_tokens``-token continuations of ``prompt``, a (VOCAB,)*new_tokens table;
    the drafter's ``last_generation_stats`` of each call): ``samples // rows`` calls of ``generate()``, each on
    ``rows`` copies of ``prompt`` (one prompt, unbatched, when ``rows`` is 1)."""
    assert samples % rows == 0, (samples, rows)
    gen_kwargs.setdefault("top_k", None)  # transformers' default top_k=50 is a no-op on 16 tokens anyway
    ids = prompt.repeat(rows, 1)
    if rows > 1:
        gen_kwargs.setdefault("attention_mask", torch.ones_like(ids))
    counts = torch.zeros([VOCAB] * new_tokens)
    stats = []
    for _ in range(samples // rows):
        out = target.generate(ids, assistant_model=drafter, max_new_tokens=new_tokens, do_sample=True, **gen_kwargs)
        for row in out[:, prompt.shape[1] :].tolist():
            counts[tuple(row)] += 1
        stats.append(drafter.last_generation_stats)
    return counts, stats


def sample_counts(target, prompt, drafter, samples=SAMPLES, rows=ROWS, **gen_kwargs):
    """(counts, as :func:`sample_batches`; the mean τ over the calls that ran a cycle)."""
    counts, stats = sample_batches(target, prompt, drafter, samples, rows, **gen_kwargs)
    taus = [s.tau for s in stats if s.cycles]
    return counts, sum(taus) / max(len(taus), 1)


COLDER = 0.85
"""The slightly wrong law every sampled test must tell its draws apart from: the warped law at 0.85 x temperature
(power of the chi-square test at 1500 draws against it: 1.0 in simulation for every case here, >0.96 at 750)."""


def sampled_law_p_value(target, prompt, drafter, warp, seed=1234, rows=ROWS, **tree):
    """(chi-square p-value of the drafter's sampled next tokens against the exact target law under
    ``warp``, mean τ): ``SAMPLES`` draws, ``rows`` per call, from ``torch.manual_seed(seed)``. Asserts that the
    same draws reject the :data:`COLDER` law: the test can fail."""
    exact = exact_joint(target, prompt, warpers(**warp))
    torch.manual_seed(seed)
    counts, tau = sample_counts(target, prompt, drafter, rows=rows, **tree, **warp)
    assert rejects_colder_law(counts, target, prompt, warp), "too little power: a slightly wrong law passes"
    return chi_square_pvalue(counts, exact), tau


def rejects_colder_law(counts, target, prompt, warp: dict) -> bool:
    """Whether the chi-square test tells ``counts`` apart from the :data:`COLDER` law: the test on them can fail."""
    colder = exact_joint(target, prompt, warpers(**{**warp, "temperature": COLDER * warp.get("temperature", 1.0)}))
    return chi_square_pvalue(counts, colder) < P_VALUE_FLOOR


_PAIR = {}


def tiny_pair(kind):
    if kind not in _PAIR:
        target = make_target("llama", vocab_size=VOCAB, logit_scale=8.0, seed=3)
        drafter = hf_spec.EagleDrafter.from_target(target)
        if kind == "trained":
            train_drafter_on_outputs(target, drafter, do_sample=True, steps=300)
        _PAIR[kind] = (target, drafter)
    return _PAIR[kind]


CASES = [  # (drafter, tree shape (depth, top_k, total), warper kwargs, rows per generate() call)
    ("trained", (4, 4, 12), dict(temperature=1.0), 1),  # the one-row path (no padding, in-place cache compaction)
    ("trained", (4, 4, 12), dict(temperature=0.7), ROWS),
    ("trained", (4, 1, 4), dict(temperature=1.0), ROWS),
    ("trained", (3, 3, 6), dict(temperature=0.7, top_p=0.8), ROWS),
    ("random", (3, 4, 8), dict(temperature=1.0, top_k=5), ROWS),
    ("random", (3, 1, 3), dict(temperature=0.7, top_p=0.9), ROWS),
    ("trained", (4, 4, 12, 0.1), dict(temperature=1.0), ROWS),  # tree_min_prob: confidence-sized trees
]


@pytest.mark.parametrize("kind,shape,warp,rows", CASES, ids=[f"{c[0]}-d{c[1][0]}k{c[1][1]}{'-floor' if len(c[1]) > 3 else ''}-{c[2]}-rows{c[3]}" for c in CASES])
def test_sampled_distribution_equals_target(kind, shape, warp, rows):
    target, drafter = tiny_pair(kind)
    prompt = random_prompt(length=6, vocab_size=VOCAB, seed=11)
    depth, top_k, total, *floor = shape
    p_value, tau = sampled_law_p_value(target, prompt, drafter, warp, rows=rows, tree_depth=depth, tree_top_k=top_k,
                                       tree_total_tokens=total, tree_min_prob=floor[0] if floor else None)  # fmt: skip
    assert p_value > P_VALUE_FLOOR, (p_value, tau)
    if kind == "trained":
        assert tau > 1.5  # drafts are really accepted, so the accept path is exercised


@pytest.mark.parametrize("linear_kernel", [kernel for kernel in KERNELS if kernel != "F.linear"])
def test_sampled_distribution_equals_target_with_the_other_kernels_forced(linear_kernel):
    """The CPU kernels the trials may choose instead of ``F.linear`` and SDPA (:mod:`hf_spec.linear_kernels`,
    :mod:`hf_spec.attention_kernels`) keep the sampled law exact: every few-row product and few-query attention of
    the target and the drafter runs the forced kernel."""
    target, drafter = tiny_pair("trained")
    prompt = random_prompt(length=6, vocab_size=VOCAB, seed=11)
    with forced_kernel(linear_kernel), forced_attention("grouped"):
        p_value, tau = sampled_law_p_value(target, prompt, drafter, dict(temperature=1.0), tree_depth=4, tree_top_k=4,
                                           tree_total_tokens=12)  # fmt: skip
    assert p_value > P_VALUE_FLOOR and tau > 1.5, (p_value, tau)


def test_a_slightly_wrong_sampler_is_rejected(monkeypatch):
    """Negative control through generate(): a verification that sharpens the target's probabilities a little
    (p^1.15, renormalised, at every drafted position) is rejected from the same batched draws."""
    from hf_spec import verify

    original = verify._rejection_sample

    def sharpened(p, *args, **kwargs):
        p = p**1.15
        return original(p / p.sum(), *args, **kwargs)

    monkeypatch.setattr(verify, "_rejection_sample", sharpened)
    target, drafter = tiny_pair("trained")
    prompt = random_prompt(length=6, vocab_size=VOCAB, seed=11)
    exact = exact_joint(target, prompt, warpers(temperature=1.0))
    torch.manual_seed(1234)
    counts, tau = sample_counts(target, prompt, drafter, tree_depth=4, tree_top_k=4, tree_total_tokens=12,
                                temperature=1.0)  # fmt: skip
    assert chi_square_pvalue(counts, exact) < P_VALUE_FLOOR, tau


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
