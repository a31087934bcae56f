"""S2D frozen-backbone recipe (issue #16): per-exit adapters, the whole source as the last exit.

``SortedDrafter.add_exit_adapters`` keeps every layer of the source frozen; each exit but the last gets its
own linear map + norm, trained by distillation from the last exit (which is the source model itself). The
checkpoint holds adapters, norm and draft map; layers, embedding and head are borrowed at bind time."""

import warnings

import pytest
import torch

import hf_spec
from conftest import make_target, plain_generate, random_prompt, save_and_read_keys
from hf_spec.drafters.s2d import SortedDrafter, SortedDrafterConfig
from hf_spec.training.losses import exit_distillation_loss
from test_sampling import VOCAB, chi_square_pvalue, exact_joint, rejects_colder_law, sample_batches, warpers

P_VALUE_FLOOR = 1e-3


def adapter_drafter(family="qwen2", thresholds=(0.5, 0.5, 0.0), vocab_size=128, seed=0, **kw):
    """A 6-layer source and a drafter of all its layers with exits 2/4/6 and exit adapters."""
    source = make_target(family, vocab_size=vocab_size, num_hidden_layers=6, seed=seed, **kw)
    source.config._name_or_path = f"tiny-{family}-source"
    entry = hf_spec.drafters.s2d.target_entry(source, thresholds)
    drafter = SortedDrafter.from_source_model(source, num_layers=6, exits=[2, 4, 6], targets=[entry])
    return source, drafter.add_exit_adapters()


def train_adapters(drafter, steps=25, lr=1e-2):
    ids = torch.randint(1, drafter.config.target_vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=lr)
    drafter.train()
    losses = []
    for _ in range(steps):
        loss = drafter(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    drafter.eval()
    return losses


def test_only_exit_adapters_train_and_the_last_exit_is_the_source():
    source, drafter = adapter_drafter()
    trainable = {n for n, p in drafter.named_parameters() if p.requires_grad}
    assert trainable == {"exit_maps.0.weight", "exit_maps.1.weight", "exit_norms.0.weight", "exit_norms.1.weight"}
    ids = random_prompt(9, seed=4)
    with torch.no_grad():
        logits = drafter(ids).logits_per_exit
        torch.testing.assert_close(logits[-1], source(ids).logits)  # exact: the last exit is the whole source
    losses = train_adapters(drafter)
    assert losses[-1] < 0.7 * losses[0], losses
    with torch.no_grad():
        torch.testing.assert_close(drafter(ids).logits_per_exit[-1], source(ids).logits)  # still exact after training


def test_exit_distillation_loss_reads_only_valid_positions():
    torch.manual_seed(0)
    early, last = torch.randn(2, 5, 7), torch.randn(2, 5, 7)
    labels = torch.full((2, 5), 3)
    labels[1, 3:] = -100  # padding: positions 2.. of row 1 predict nothing
    loss = exit_distillation_loss([early, last], labels)
    keep = labels[:, 1:] != -100
    teacher = torch.softmax(last[:, :-1][keep], -1)
    expected = -(teacher * torch.log_softmax(early[:, :-1][keep], -1)).sum(-1).mean()
    torch.testing.assert_close(loss, expected)
    assert float(exit_distillation_loss([last, last], labels)) == pytest.approx(
        float(-(teacher * teacher.log()).sum(-1).mean()), rel=1e-5)  # fmt: skip  # KL 0: the teacher's entropy
    with pytest.raises(ValueError, match="at least two exits"):
        exit_distillation_loss([last], labels)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_with_exit_adapters_and_a_draft_vocabulary_equals_plain_generate(family):
    source, drafter = adapter_drafter(family)
    train_adapters(drafter)
    prompts = torch.cat([random_prompt(6, seed=100 + s) for s in range(8)])
    counts = torch.bincount(plain_generate(source, prompts, max_new_tokens=16, do_sample=False)[:, 6:].reshape(-1),
                            minlength=128)  # fmt: skip
    drafter.set_draft_vocab(counts, 40)
    exits, accepted = [0, 0, 0], 0
    for seed in (1, 2, 3):
        prompt = random_prompt(10, seed=seed)
        expected = plain_generate(source, prompt, max_new_tokens=24, do_sample=False)
        out = source.generate(prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False, tree_depth=4)
        assert torch.equal(out, expected)
        stats = drafter.last_generation_stats
        exits = [a + b for a, b in zip(exits, stats.early_exits.exit_counts)]
        accepted += sum(stats.accepted_lengths)
    assert exits[0] > 0 and exits[-1] > 0, exits  # early exits fire and the source itself drafts too
    assert accepted > 0


def test_tree_min_prob_stops_the_chain_and_stays_lossless():
    source, drafter = adapter_drafter(thresholds=(2.0, 2.0, 0.0))  # always the last exit: the source itself
    drafted = {}
    for floor in (None, 0.6):
        drafted[floor] = 0
        for seed in (1, 2):
            prompt = random_prompt(10, seed=seed)
            expected = plain_generate(source, prompt, max_new_tokens=20, do_sample=False)
            out = source.generate(prompt, assistant_model=drafter, max_new_tokens=20, do_sample=False, tree_depth=5,
                                  tree_min_prob=floor)  # fmt: skip
            assert torch.equal(out, expected)
            drafted[floor] += sum(drafter.last_generation_stats.early_exits.exit_counts)
    assert drafted[0.6] < drafted[None], drafted  # the untrained source is unsure: chains stop early


@pytest.mark.parametrize("floor", [0.0, 0.3])
def test_sampling_with_exit_adapters_keeps_target_distribution(floor):
    source, drafter = adapter_drafter(vocab_size=VOCAB, logit_scale=8.0, seed=3, thresholds=(0.4, 0.6, 0.0))
    train_adapters(drafter, steps=10)
    prompt = random_prompt(length=6, vocab_size=VOCAB, seed=11)
    exact = exact_joint(source, prompt, warpers(temperature=1.0))
    torch.manual_seed(1234)
    # 2,400 draws: this source's law is flat (22 cells of 4,096 expect 5 draws in 1,200), so 1,200 draws told it apart
    # from the law at 0.85 x temperature only ~half the time (simulated power 0.48; 1.0 at 2,400)
    counts, stats = sample_batches(source, prompt, drafter, 2400, tree_depth=3, temperature=1.0,
                                   tree_min_prob=floor)  # fmt: skip
    totals = [sum(exits) for exits in zip(*(s.early_exits.exit_counts for s in stats))]
    accepted = sum(sum(s.accepted_lengths) for s in stats)
    assert chi_square_pvalue(counts, exact) > P_VALUE_FLOOR
    assert rejects_colder_law(counts, source, prompt, dict(temperature=1.0))  # the test can fail
    assert sum(t > 0 for t in totals) >= 2, totals
    assert accepted > 0


def test_checkpoint_holds_only_adapters_and_reloads_bound_to_the_source(tmp_path):
    source, drafter = adapter_drafter()
    train_adapters(drafter, steps=5)
    ids = random_prompt(9, seed=4)
    reference, keys = save_and_read_keys(drafter, ids, tmp_path)
    assert keys == {"exit_maps.0.weight", "exit_maps.1.weight", "exit_norms.0.weight", "exit_norms.1.weight",
                    "norm.weight"}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = SortedDrafter.from_pretrained(tmp_path)
    assert loaded.config.exit_adapters
    with pytest.raises(RuntimeError, match="bind"):
        loaded(ids)
    loaded.bind(source)
    with torch.no_grad():
        for a, b in zip(loaded(ids).logits_per_exit, reference):
            torch.testing.assert_close(a, b)
    other = make_target("qwen2", vocab_size=128, num_hidden_layers=3, seed=7)
    other.config._name_or_path = "someone/else"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = SortedDrafter.from_pretrained(tmp_path)
        with pytest.raises(ValueError, match=r"borrowed at bind time from its source model 'tiny-qwen2-source'.*Fix"):
            again.bind(other)  # the 1.5B without the 0.5B installed, in miniature
        again.attach_source(source).bind(other)
    prompt = random_prompt(10, seed=3)
    out = other.generate(prompt, assistant_model=again, max_new_tokens=16, do_sample=False)
    assert torch.equal(out, plain_generate(other, prompt, max_new_tokens=16, do_sample=False))


def test_clear_errors():
    _, drafter = adapter_drafter()
    with pytest.raises(ValueError, match="exit adapters.*not both"):
        SortedDrafterConfig(num_layers=4, exits=[2, 4], lora={"r": 4, "alpha": 8, "target_modules": ["q_proj"]},
                            exit_adapters=True, layer_config={"model_type": "qwen2"})  # fmt: skip
    with pytest.raises(ValueError, match="already borrows"):
        drafter.add_exit_adapters()
    with pytest.raises(ValueError, match="own adapter.*to_causal_lm\\(\\) for the last exit"):
        drafter.to_causal_lm(2)
    lm = drafter.to_causal_lm()  # the last exit is a plain transformers LM: the source itself
    ids = random_prompt(7)
    with torch.no_grad():
        torch.testing.assert_close(lm(ids).logits, drafter(ids).logits_per_exit[-1])


def test_model_card_describes_the_frozen_backbone_recipe():
    from hf_spec.hub.cards import render_model_card

    source, drafter = adapter_drafter()
    card = render_model_card(drafter.config)
    assert "frozen-backbone recipe: all 6 layers of `tiny-qwen2-source`" in card and "exits after layers 2, 4, 6" in card
    plain = SortedDrafter.from_source_model(source, num_layers=4)
    assert "frozen-backbone" not in render_model_card(plain.config)
