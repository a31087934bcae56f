"""CORAL's Cross-Step Representation Alignment as the paper defines it (§3.1 Eq. 2, App. A): at training step t
the query is step t's output at a position, its positives the same position's outputs of steps 1..t-1 and the
target's feature, every other feature of steps 1..t and the target (other positions) a negative; the loss of
step t joins that step's loss in the CORAL trainer."""

from __future__ import annotations

import math

import pytest
import torch

import hf_spec
from conftest import make_target
from hf_spec.training.losses import csra_loss_per_step
from hf_spec.training.trainers import CoralTrainer, CoralTrainingArguments

# Two positions (0, 1), three steps, 2-d features given by their angle (radians) and an arbitrary norm:
# cosine similarity of two of them is cos(angle difference).
ANGLES = {
    ("T", 0): 0.0, ("T", 1): math.pi / 2,  # the target's features
    (1, 0): 0.3, (1, 1): math.pi / 2 + 0.2,  # step 1's outputs
    (2, 0): -0.4, (2, 1): 1.2,  # step 2's
    (3, 0): 0.9, (3, 1): 2.5,  # step 3's
}  # fmt: skip
NORMS = {key: 0.5 + 0.25 * i for i, key in enumerate(ANGLES)}  # cosine similarity must ignore them

# Spelled out by hand from the paper: per step, per query, (positives, F = every feature existing at step t
# except the query itself). Later steps never appear at step t.
T0, T1 = ("T", 0), ("T", 1)
HAND = {
    1: [((1, 0), [T0], [T0, T1, (1, 1)]),
        ((1, 1), [T1], [T0, T1, (1, 0)])],
    2: [((2, 0), [T0, (1, 0)], [T0, T1, (1, 0), (1, 1), (2, 1)]),
        ((2, 1), [T1, (1, 1)], [T0, T1, (1, 0), (1, 1), (2, 0)])],
    3: [((3, 0), [T0, (1, 0), (2, 0)], [T0, T1, (1, 0), (1, 1), (2, 0), (2, 1), (3, 1)]),
        ((3, 1), [T1, (1, 1), (2, 1)], [T0, T1, (1, 0), (1, 1), (2, 0), (2, 1), (3, 0)])],
}  # fmt: skip


def _vector(key):
    return [NORMS[key] * math.cos(ANGLES[key]), NORMS[key] * math.sin(ANGLES[key])]


def _features():
    steps = [torch.tensor([_vector((s, 0)), _vector((s, 1))], dtype=torch.float32) for s in (1, 2, 3)]
    return steps, torch.tensor([_vector(T0), _vector(T1)], dtype=torch.float32)


def _hand_loss(step: int, tau: float) -> float:
    """Eq. 2 for each (query, positive) pair, averaged over the positives, then over the queries."""
    per_query = []
    for q, positives, pool in HAND[step]:

        def sim(f, q=q):
            return math.cos(ANGLES[q] - ANGLES[f]) / tau

        log_z = math.log(sum(math.exp(sim(f)) for f in pool))
        per_query.append(sum(-(sim(p) - log_z) for p in positives) / len(positives))
    return sum(per_query) / len(per_query)


@pytest.mark.parametrize("tau", [0.07, 0.5])
def test_per_step_csra_hand_computed_two_positions_three_steps(tau):
    steps, targets = _features()
    got = csra_loss_per_step(steps, targets, temperature=tau)
    assert got.shape == (3,)
    for t in (1, 2, 3):
        assert got[t - 1].item() == pytest.approx(_hand_loss(t, tau), abs=1e-5), t


def test_per_step_csra_closed_form_when_every_step_equals_the_target():
    """Positions orthogonal, every step's output equal to the target: at step t the query's t positives have
    sim 1 and the (t + 1)(N - 1) negatives sim 0, so each term is -log(e^{1/τ} / (t e^{1/τ} + (t + 1)(N - 1)))."""
    tau, n_pos = 0.25, 2
    targets = torch.tensor([[3.0, 0.0], [0.0, 0.5]])
    got = csra_loss_per_step([targets * 2, targets, targets * 0.1], targets, temperature=tau)
    expected = [math.log(t + (t + 1) * (n_pos - 1) * math.exp(-1 / tau)) for t in (1, 2, 3)]
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-5, rtol=0)


def test_a_step_sees_only_itself_the_earlier_steps_and_the_target():
    """Step 1's queries take only the target as positive: changing step 2's or step 3's outputs leaves L_1
    unchanged, step 3's leaves L_2 unchanged too."""
    steps, targets = _features()
    base = csra_loss_per_step(steps, targets, temperature=0.1)
    moved3 = csra_loss_per_step([steps[0], steps[1], -steps[2] + 0.3], targets, temperature=0.1)
    torch.testing.assert_close(moved3[:2], base[:2], atol=1e-7, rtol=0)
    assert abs(moved3[2] - base[2]) > 1e-3
    moved2 = csra_loss_per_step([steps[0], steps[1].flip(-1), steps[2]], targets, temperature=0.1)
    torch.testing.assert_close(moved2[0], base[0], atol=1e-7, rtol=0)
    assert abs(moved2[1] - base[1]) > 1e-3 and abs(moved2[2] - base[2]) > 1e-3


def test_gradients_reach_the_query_step_and_the_earlier_steps_only():
    torch.manual_seed(0)
    steps = [torch.randn(6, 8, requires_grad=True) for _ in range(3)]
    targets = torch.randn(6, 8)
    losses = csra_loss_per_step(steps, targets)
    losses[0].backward(retain_graph=True)
    assert steps[0].grad.abs().sum() > 0
    assert all(s.grad is None or not s.grad.any() for s in steps[1:])  # L_1 does not depend on steps 2, 3
    losses[2].backward()
    for s in steps:
        assert s.grad is not None and torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0


def test_bf16_features_and_untrained_level():
    """bf16 inputs are scored in fp32; unaligned features (near-zero cosines: random in high dimension) score
    about log((t + 1) N - 1), the log of the candidate count (+ σ²/2 for logits of spread σ = 1/(τ√h) ≈ 0.3)."""
    torch.manual_seed(0)
    n, h = 64, 2048
    steps = [torch.randn(n, h).bfloat16() for _ in range(3)]
    got = csra_loss_per_step(steps, torch.randn(n, h).bfloat16())
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    for t in (1, 2, 3):
        assert got[t - 1].item() == pytest.approx(math.log((t + 1) * n - 1), abs=0.15)


# -- the CORAL trainer ---------------------------------------------------------------------------
def _coral_trainer(tmp_path, **overrides):
    target = make_target("llama")
    torch.manual_seed(0)
    drafter = hf_spec.EagleDrafter.from_target(target)
    args = CoralTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", feature_noise=0.0,
                                  disable_tqdm=True, **overrides)  # fmt: skip
    return target, CoralTrainer(model=drafter, args=args)


def _batch(target, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, target.config.vocab_size, (2, 14), generator=g)
    with torch.no_grad():
        hidden = target.base_model(input_ids=ids).last_hidden_state
    loss_mask = torch.ones_like(ids)
    loss_mask[:, :4] = 0  # a prompt
    attention_mask = torch.ones_like(ids)
    attention_mask[1, -3:] = 0  # padding
    return {"input_ids": ids, "hidden_states": hidden, "loss_mask": loss_mask, "attention_mask": attention_mask}


def test_coral_trainer_adds_the_per_step_csra_to_each_step(tmp_path):
    target, trainer = _coral_trainer(tmp_path / "a", w_csra=0.3)
    batch = _batch(target)
    loss, out = trainer.compute_loss(trainer.model, batch, return_outputs=True)
    assert torch.isfinite(loss) and loss.requires_grad
    csra = [out[f"csra_{t}"].item() for t in (1, 2, 3)]
    assert all(math.isfinite(c) and c > 0 for c in csra)
    loss.backward()
    grads = [p.grad for p in trainer.model.parameters() if p.requires_grad and p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)

    _, without = _coral_trainer(tmp_path / "b", w_csra=0.0)
    with torch.no_grad():
        base = without.compute_loss(without.model, batch).item()
        again = trainer.compute_loss(trainer.model, batch).item()  # (grads do not change the weights)
    assert again == pytest.approx(base + 0.3 * sum(csra), rel=1e-5)
    prefix = "" if trainer.model.training else "eval_"  # what the next log reports, averaged over both calls
    trainer.log({f"{prefix}loss": 0.0})
    assert trainer.state.log_history[-1][f"{prefix}csra_weighted"] == pytest.approx(0.3 * sum(csra) / 3, abs=2e-5)
