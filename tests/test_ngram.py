"""NGramDrafter: weightless context n-gram TREE drafting; lossless greedy, batched and sampled."""

import os

import pytest
import torch

import hf_spec
from conftest import make_target, plain_generate, random_prompt
from hf_spec.drafters.ngram import (FALLBACK_NODE_COST, NGramIndex, find_continuations, match_acceptance,
                                   measure_match_lengths, scored_trie, trie_to_draft_tree)
from hf_spec.verify import _rejection_sample
from test_batched import check_batch
from test_sampling import (P_VALUE_FLOOR, VOCAB, chi_square_pvalue, exact_joint, rejects_colder_law, sample_batches,
                           warpers)  # fmt: skip

SHAPES = [None, (1, 1, 1), (8, 1, 8), (4, 4, 16), (8, 4, 3)]  # (depth, top_k, total); None: defaults


def repetitive_prompt(seed=1, period=7, repeats=3, vocab_size=128):
    base = random_prompt(length=period, vocab_size=vocab_size, seed=seed)
    return base.repeat(1, repeats)


def tree_kwargs(shape):
    if shape is None:
        return {}
    depth, top_k, total = shape
    return dict(tree_depth=depth, tree_top_k=top_k, tree_total_tokens=total)


def session_for(tokens, **config):
    """A session whose context is ``tokens`` (the prompt), and the tree it drafts after it."""
    drafter = hf_spec.NGramDrafter(**config)
    tokens = torch.tensor([tokens])
    session = drafter.new_drafting_session(None, drafter.tree_shape(), False, prompt_ids=tokens)
    return session, session.propose(None, tokens[0, 1:])


def capture_trees(monkeypatch):
    """Record every tree the n-gram sessions propose."""
    trees = []
    original = hf_spec.drafters.ngram.NGramDraftingSession.propose

    def propose(self, features, next_tokens):
        tree = original(self, features, next_tokens)
        trees.append(tree)
        return tree

    monkeypatch.setattr(hf_spec.drafters.ngram.NGramDraftingSession, "propose", propose)
    return trees


# -- greedy ------------------------------------------------------------------------------------
def target_text_prompt(target, seed=1):
    """The target's own greedy text: tiny random targets settle into loops, so what follows is
    (mostly) already in the context and the n-gram drafts are accepted."""
    return plain_generate(target, random_prompt(seed=seed), max_new_tokens=50, do_sample=False)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "default" if s is None else "d%d-k%d-n%d" % s)
def test_greedy_matches_plain_on_repetitive_prompts(family, shape):
    """The timed sizing (node_cost None) on one prompt; a fixed node cost where acceptance is asserted (sizes from a
    live timing on a loaded 2-core CI box made tau a coin toss)."""
    target = make_target(family)
    for prompt, matches_certain in ((repetitive_prompt(seed=1), False), (target_text_prompt(target), True)):
        drafter = hf_spec.NGramDrafter(node_cost=FALLBACK_NODE_COST if matches_certain else None)
        expected = plain_generate(target, prompt, max_new_tokens=24, do_sample=False)
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False,
                              **tree_kwargs(shape))  # fmt: skip
        assert torch.equal(out, expected)
        if matches_certain:
            stats = drafter.last_generation_stats
            assert stats.tau > (1.3 if shape == (1, 1, 1) else 1.5), stats.accepted_lengths  # d1: tau <= 2
            if shape is None:
                assert max(stats.accepted_lengths) >= 4, stats.accepted_lengths  # long branches accepted


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_copy_cycles_draft_long_chains_and_match_plain(family, monkeypatch):
    """copy_nodes: a cycle whose context repeats its whole max_match suffix drafts up to copy_nodes nodes
    (deeper than max_depth), others the normal budget; the output is still plain greedy."""
    target = make_target(family)
    trees = capture_trees(monkeypatch)
    drafter = hf_spec.NGramDrafter(num_draft_tokens=4, max_depth=4, copy_nodes=16, node_cost=FALLBACK_NODE_COST)
    prompt = target_text_prompt(target)
    expected = plain_generate(target, prompt, max_new_tokens=32, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=32, do_sample=False)
    assert torch.equal(out, expected)
    sizes = [len(t) - 1 for t in trees]
    assert max(sizes) > 4 and max(sizes) <= 16  # copy cycles drafted beyond the normal budget, within theirs
    assert max(int(t.depths.max()) for t in trees) > 4
    assert max(drafter.last_generation_stats.accepted_lengths) > 4  # and the long chains were accepted
    # a copy cycle needs the whole suffix repeated: on distinct tokens no tree grows
    _, tree = session_for([3, 4, 5, 6, 7], copy_nodes=16)
    assert len(tree) == 1
    with pytest.raises(ValueError, match="copy_depth"):
        hf_spec.NGramDrafter(copy_nodes=8, copy_depth=0)


def test_no_match_gives_a_root_only_tree_and_plain_output():
    _, tree = session_for([3, 4, 5, 6, 7])  # all distinct: the root 7 never occurred before
    assert len(tree) == 1 and tree.expanded.numel() == 0 and int(tree.tokens[0]) == 7
    target = make_target("llama")
    prompt = torch.arange(10, 20).view(1, -1)
    drafter = hf_spec.NGramDrafter(min_match=3, max_match=4)
    expected = plain_generate(target, prompt, max_new_tokens=6, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=6, do_sample=False)
    assert torch.equal(out, expected)
    assert drafter.last_generation_stats.accepted_lengths[0] == 0


def test_match_at_the_very_end_of_the_context():
    _, tree = session_for([5, 7, 7])  # "7" occurred just before the root; it was followed by the root itself
    assert tree.tokens.tolist() == [7, 7] and tree.parents.tolist() == [-1, 0]
    _, tree = session_for([1, 2, 3, 1, 2, 3])  # the continuation runs into the current suffix, then stops
    assert tree.tokens.tolist() == [3, 1, 2, 3] and tree.depths.tolist() == [0, 1, 2, 3]
    target = make_target("qwen2")
    prompt = torch.tensor([[9, 4, 4]])
    expected = plain_generate(target, prompt, max_new_tokens=20, do_sample=False)
    out = target.generate(prompt, assistant_model=hf_spec.NGramDrafter(), max_new_tokens=20, do_sample=False)
    assert torch.equal(out, expected)


def test_eos_inside_a_drafted_branch_stops_like_plain(family, monkeypatch):
    target = make_target(family)
    seed_prompt = random_prompt(seed=6)
    text = plain_generate(target, seed_prompt, max_new_tokens=30, do_sample=False)
    prompt = torch.cat([text, seed_prompt], dim=1)  # varied target text, then its start again
    future = plain_generate(target, prompt, max_new_tokens=30, do_sample=False)[0, prompt.shape[1] :]
    trees = capture_trees(monkeypatch)
    inside = 0
    for position in range(1, 16):
        eos = int(future[position])
        if eos in future[:position].tolist():
            continue  # plain decoding would stop earlier
        trees.clear()
        expected = plain_generate(target, prompt, max_new_tokens=30, do_sample=False, eos_token_id=eos)
        out = target.generate(prompt, assistant_model=hf_spec.NGramDrafter(), max_new_tokens=30,
                              do_sample=False, eos_token_id=eos)  # fmt: skip
        assert torch.equal(out, expected)
        assert int(out[0, -1]) == eos
        if trees:  # did the tree that emitted EOS draft it with more tokens below it?
            last = trees[-1]
            eos_nodes = (last.tokens[1:] == eos).nonzero().view(-1) + 1
            inside += any(bool((last.parents == int(n)).any()) for n in eos_nodes)
    assert inside >= 1


def test_branches_cover_several_continuations_ranked_by_count():
    # After "8": "1" three times, "2" once (most recent): both drafted, "1" first.
    _, tree = session_for([8, 1, 8, 1, 8, 2, 8, 1, 5, 8], max_match=1)
    children = tree.children(0)
    assert tree.tokens[children].tolist() == [1, 2]
    assert tree.candidate_tokens[0, :2].tolist() == [1, 2]
    # A longer match outranks a more frequent shorter one.
    _, tree = session_for([4, 8, 2, 9, 8, 1, 9, 8, 1, 4, 8], max_match=2, max_branches=1, num_draft_tokens=1)
    assert tree.tokens.tolist() == [8, 2]
    # max_branches=1 gives a chain; the trie merges shared prefixes.
    _, tree = session_for([8, 1, 8, 1, 8, 2, 8], max_branches=1)
    assert bool((tree.depths == torch.arange(len(tree))).all())


def test_trie_nodes_are_reusable_without_a_session():
    index = NGramIndex(1, 3)
    index.extend([1, 2, 3, 1, 2, 4, 1, 2])
    trie = scored_trie(find_continuations(index, max_depth=4, max_occurrences=8), num_nodes=6, max_depth=4,
                       max_branches=4)  # fmt: skip
    # Suffix "1 2" was followed by "3 1 2 4" and "4 1 2": two branches under the root, the more recent first.
    assert trie.tokens[:2] == [4, 3] and trie.parents[:2] == [-1, -1] and len(trie) == 6
    assert all(trie.parents[i] < i for i in range(len(trie)))  # BFS order: parents first
    tree = trie_to_draft_tree(2, trie)
    assert len(tree) == 7 and tree.draft_probs is None and int(tree.tokens[0]) == 2


def test_tree_kwargs_and_options_are_validated():
    drafter = hf_spec.NGramDrafter(max_depth=5, num_draft_tokens=9, max_branches=2)
    shape = drafter.tree_shape()
    assert (shape.depth, shape.total_tokens, shape.top_k) == (5, 9, 2)
    shape = drafter.tree_shape(3, 1, 4)
    assert (shape.depth, shape.top_k, shape.total_tokens) == (3, 1, 4)
    shape.validate(sampling=True)  # point-mass drafts need no pinned expanded nodes
    with pytest.raises(ValueError, match="min_match"):
        hf_spec.NGramDrafter(min_match=3, max_match=2)
    with pytest.raises(ValueError, match="tree_depth"):
        drafter.tree_shape(0).validate(False)


# -- scored trees --------------------------------------------------------------------------------
def test_match_acceptance_grows_with_the_match():
    values = [match_acceptance(m) for m in (1, 2, 4, 9, 32)]
    assert values == sorted(values) and 0.25 < values[0] < 0.35 and values[-1] > 0.9


def test_measured_match_length_tells_a_copied_passage_from_a_common_ngram():
    passage = list(range(10, 30))
    # The suffix's last 4-gram (18..21) follows the passage once more, later, with another follower (77).
    context = [99] + passage + [18, 19, 20, 21, 77, 1, 2] + passage[:12]
    index = NGramIndex(1, 4)
    index.extend(context)
    found = list(find_continuations(index, 8, 16))
    assert found[0].tokens[0] == 77 and found[0].match_length == found[1].match_length == 4  # most recent first
    measured = measure_match_lengths(index, found)
    assert (measured[0].tokens[0], measured[0].match_length) == (22, 12)  # the passage so far, then 2 != 99
    assert measured[1].tokens[0] == 77 and measured[1].match_length == 4
    assert [c.match_length for c in measured] == sorted((c.match_length for c in measured), reverse=True)
    periodic = NGramIndex(1, 4)
    periodic.extend([1, 2, 3] * 1000)
    assert max(c.match_length for c in measure_match_lengths(periodic, list(find_continuations(periodic, 8, 16)))) == 32
    # The default drafter follows the passage as a deep chain, past the old 8-node trees.
    _, tree = session_for(context)
    assert tree.tokens[1:11].tolist() == context[13:23] and bool((tree.depths == torch.arange(len(tree))).all())


def test_scored_trie_splits_probability_between_disagreeing_occurrences():
    index = NGramIndex(1, 4)
    index.extend([9, 1, 5, 9, 1, 6, 9, 1])  # "9 1" was followed by 5 and by 6
    trie = scored_trie(list(find_continuations(index, 8, 16)), num_nodes=16, max_depth=8, max_branches=4)
    first = [p for p, parent in zip(trie.probabilities, trie.parents) if parent == -1]
    assert sorted(trie.tokens[:2]) == [5, 6] and first == pytest.approx([0.5 * match_acceptance(2)] * 2)
    assert all(trie.probabilities[i] <= trie.probabilities[trie.parents[i]] for i in range(len(trie)) if trie.parents[i] >= 0)
    tree = trie_to_draft_tree(1, trie)
    assert torch.allclose(tree.scores[1:].exp(), torch.tensor(trie.probabilities))


def test_a_run_of_one_token_is_drafted_deep():
    """Occurrences whose continuation stops at the end of the context are no evidence against going on."""
    _, tree = session_for([3] + [53] * 6)
    assert len(tree) - 1 >= 4 and set(tree.tokens[1:].tolist()) == {53}


def test_node_cost_sizes_the_tree():
    context = [4, 8, 2, 9, 8]  # "8" was followed once by "2 9 8": a 1-token match, likely wrong
    sizes = {cost: len(session_for(context, node_cost=cost)[1]) - 1 for cost in (0.0, 0.035, 0.5)}
    assert sizes[0.0] == 3 and 1 <= sizes[0.035] <= 3 and sizes[0.5] == 0
    with pytest.raises(ValueError, match="node_cost"):
        hf_spec.NGramDrafter(node_cost=-1)


def test_default_sizes_trees_by_this_machines_measured_verification_costs(monkeypatch):
    """node_cost None: the cut weighs acceptance against the target's measured curve (verify_cost.verify_cost_curve),
    so a flat curve (a GPU, AMX) drafts the whole tree and a steep one drafts nothing on a weak match."""
    from hf_spec import verify_cost
    from hf_spec.decoding import new_session
    from hf_spec.drafters.ngram import FALLBACK_NODE_COST, relative_node_costs

    context = torch.tensor([[4, 8, 2, 9, 8]])
    target = make_target("llama")
    drafter = hf_spec.NGramDrafter()
    assert drafter.config.node_cost is None
    sizes = {}
    for name, curve in {"flat": {1: 10.0, 64: 10.0}, "steep": {1: 10.0, 2: 20.0, 64: 640.0}}.items():
        monkeypatch.setattr(verify_cost, "verify_cost_curve", lambda model, curve=curve: curve)
        session = new_session(drafter, target, drafter.tree_shape(), False, 1.0, context, None)  # the loop's
        sizes[name] = len(session.propose(None, context[0, 1:])) - 1
    assert sizes == {"flat": 3, "steep": 0}
    # a straight-line curve prices each node as the same number would: t(n + 1) / t(1) - 1 = c * n
    assert relative_node_costs({1: 40.0, 17: 56.0}, 16, margin=1.0) == pytest.approx([1 + 0.025 * n for n in range(17)])
    # a fixed number wins over the machine; no target (replays): the fallback number
    fixed = hf_spec.NGramDrafter(node_cost=0.5)
    assert new_session(fixed, target, fixed.tree_shape(), False, 1.0, context, None).node_cost == 0.5
    assert new_session(drafter, None, drafter.tree_shape(), False, 1.0, context, None).node_cost == FALLBACK_NODE_COST


def test_verify_cost_curve_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    from hf_spec import verify_cost

    monkeypatch.setenv("HF_SPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(verify_cost, "_curves", {})
    calls = []

    def measure(model, sizes, **kwargs):
        calls.append(sizes)
        return {n: 10.0 + n - (6.0 if n == 8 else 0.0) for n in sizes}  # a dip at 8 is timing noise

    monkeypatch.setattr(verify_cost, "measure_verify_cost", measure)
    target = make_target("llama")
    curve = verify_cost.verify_cost_curve(target)
    assert calls == [verify_cost.VERIFY_CURVE_SIZES] and curve[8] == curve[6] == 16.0 and curve[64] == 74.0
    assert all(n in curve for n in range(1, 7))  # every small size timed: few-token costs are a step function
    monkeypatch.setattr(verify_cost, "_curves", {})  # a new process: read from $HF_SPEC_CACHE/verify_costs, not timed again
    assert verify_cost.verify_cost_curve(target) == curve and len(calls) == 1
    assert len(list((tmp_path / "verify_costs").glob("*.json"))) == 1


# -- cost --------------------------------------------------------------------------------------
def test_per_cycle_cost_is_flat_in_context_length():
    """Index updates per token and occurrences scanned per tree do not grow with the context."""
    costs = []
    for length in (50, 5000, 50000):
        context = ([1, 2, 3] * length)[:length]
        session, _ = session_for(context, max_match=4, min_match=1, max_occurrences=16)
        before = session.index.operations
        session.propose(None, torch.tensor([1, 2, 3]))
        updates = session.index.operations - before
        found = list(find_continuations(session.index, 8, 16))
        measure_match_lengths(session.index, found)  # at most 32 comparisons per occurrence
        trie = scored_trie(found, 16, 8, 4)
        costs.append((updates, trie.occurrences))
    assert costs[1] == costs[2]  # 10x the context, the same work
    assert all(updates == 3 * 4 for updates, _ in costs)  # three new tokens, one update per n in [1, 4]
    assert all(scanned <= 16 * 4 for _, scanned in costs)  # max_occurrences per match length


# -- sampling ----------------------------------------------------------------------------------
def test_point_mass_rejection_sampling_is_exact():
    """Recursive rejection over point-mass candidates emits exactly p and accepts c with p(c)."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(VOCAB, generator=g) * 2, dim=-1)
    candidates = torch.tensor([int(p.argmax()), 3, 5, -1])
    nodes = torch.tensor([1, 2, 3, -1])
    counts, accepted = torch.zeros(VOCAB), torch.zeros(4)
    draws = 20000
    for _ in range(draws):
        token, node = _rejection_sample(p, None, candidates, nodes, g)
        counts[token] += 1
        if node >= 0:
            accepted[node] += 1
            assert int(candidates[node - 1]) == token
    assert chi_square_pvalue(counts, p) > P_VALUE_FLOOR
    # A candidate is emitted only by accepting it: acceptance of c has probability p(c), the best possible.
    assert torch.equal(accepted[1:], counts[candidates[:3]])
    wrong = torch.softmax(torch.log(p) / 0.8, dim=-1)  # negative control: the test can fail
    assert chi_square_pvalue(counts, wrong) < P_VALUE_FLOOR


def repetitive_sampling_case(warp):
    """(target, prompt, exact joint law of the next 3 tokens): the prompt is sampled target text followed by
    its own start again, so the context's n-grams are likely continuations under ``warp``."""
    target = make_target("llama", vocab_size=VOCAB, logit_scale=8.0, seed=3)
    seed_prompt = random_prompt(length=4, vocab_size=VOCAB, seed=11)
    torch.manual_seed(0)
    text = plain_generate(target, seed_prompt, max_new_tokens=24, do_sample=True, top_k=None, **warp)
    prompt = torch.cat([text, seed_prompt], dim=1)
    return target, prompt, exact_joint(target, prompt, warpers(**warp))


@pytest.mark.parametrize("node_cost", [0.0, 0.035], ids=["full-trees", "sized-trees"])
@pytest.mark.parametrize("warp", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9)], ids=str)
def test_sampled_distribution_equals_target(warp, node_cost, monkeypatch):
    """Full trees (node_cost 0) exercise many accepts and rejects; sized trees (the default) change size with the
    committed text, which keeps them point-mass drafts."""
    target, prompt, exact = repetitive_sampling_case(warp)
    trees = capture_trees(monkeypatch)
    drafter = hf_spec.NGramDrafter(max_depth=3, node_cost=node_cost)
    torch.manual_seed(1234)
    counts, stats = sample_batches(target, prompt, drafter, **warp)  # in batches of rows; token 0 (pad) may occur
    accepted = [length for s in stats for length in s.accepted_lengths]
    p_value = chi_square_pvalue(counts, exact)
    assert p_value > P_VALUE_FLOOR, p_value
    assert rejects_colder_law(counts, target, prompt, warp)  # the test can fail
    assert sum(accepted) / len(accepted) > (0.5 if node_cost == 0 else 0.3)  # the accept path is exercised
    assert max(t.candidate_tokens.shape[1] for t in trees) >= 2  # and trees really branch
    if node_cost:
        assert len({len(t) for t in trees}) >= 3  # sizes follow the committed text


# -- batches and the bench harness ---------------------------------------------------------------
def test_batch_matches_per_row_plain_greedy(family):
    target = make_target(family)
    prompts = [repetitive_prompt(seed=s, period=p, repeats=r)[0] for s, p, r in ((1, 5, 3), (2, 7, 2), (3, 4, 4))]
    drafter = hf_spec.NGramDrafter()
    check_batch(target, drafter, prompts, max_new_tokens=30)
    stats = drafter.last_generation_stats
    assert len(stats.rows) == 3 and stats.tau > 1.5 and stats.verify_forwards < 30


def test_bench_method_hf_spec_ngram():
    from hf_spec.bench.harness import BenchSettings, parse_method, run_benchmark, summarize

    method = parse_method("hf_spec:ngram:depth=6:tokens=10:branches=2", torch.float32)
    drafter = method.generate_kwargs["assistant_model"]
    assert isinstance(drafter, hf_spec.NGramDrafter)
    assert (drafter.config.max_depth, drafter.config.num_draft_tokens, drafter.config.max_branches) == (6, 10, 2)
    assert method.info["drafter"] == "ngram" and method.info["max_depth"] == 6
    assert parse_method("hf_spec:ngram:node_cost=0.02", torch.float32).info["node_cost"] == 0.02
    with pytest.raises(ValueError, match="unknown n-gram option"):
        parse_method("hf_spec:ngram:deep=6", torch.float32)
    target = make_target("llama")
    prompts = {"rep": [{"id": f"rep/{i}", "input_ids": repetitive_prompt(seed=i)[0].tolist()} for i in range(2)]}
    methods = [parse_method("plain"), parse_method("hf_spec:ngram")]
    rows = run_benchmark(target, prompts, methods, BenchSettings(max_new_tokens=16, warmup_tokens=4))
    summary = summarize(rows, [m.name for m in methods])["all"]["hf_spec:ngram"]
    assert summary["identical"] == 2 and summary["tau"] > 1.5
    assert all(r["accepted_lengths"] for r in rows if r["method"] == "hf_spec:ngram")


def test_an_ngram_drafter_saves_and_loads_back_with_its_datastore(tmp_path):
    """A weightless drafter saves its config and datastore (no weights to save) and AutoDrafter loads it back:
    the same settings, the same corpus, the same greedy output."""
    from hf_spec.drafters.datastore import NGramDatastore

    target = make_target("llama")
    prompt = random_prompt(12)
    store = NGramDatastore.from_documents([prompt[0].tolist() * 2], min_match=1, max_match=3)
    drafter = hf_spec.NGramDrafter(max_depth=5, num_draft_tokens=7, datastore=store)
    drafter.save_pretrained(tmp_path)
    loaded = hf_spec.AutoDrafter.from_pretrained(tmp_path)
    assert isinstance(loaded, hf_spec.NGramDrafter)
    assert (loaded.config.max_depth, loaded.config.num_draft_tokens) == (5, 7)
    assert loaded.ngram_datastore is not None and (loaded.ngram_datastore.tokens == store.tokens).all()
    expected = plain_generate(target, prompt, max_new_tokens=20, do_sample=False)
    assert torch.equal(target.generate(prompt, assistant_model=loaded, max_new_tokens=20, do_sample=False), expected)
    os.utime(tmp_path / "ngram_datastore.safetensors", ns=(10**9, 10**9))  # a time no new write can have
    drafter.save_pretrained(tmp_path)  # the same datastore again: the file is kept as it is
    assert (tmp_path / "ngram_datastore.safetensors").stat().st_mtime_ns == 10**9
    drafter.ngram_datastore = NGramDatastore.from_documents([prompt[0].tolist()], min_match=1, max_match=3)
    drafter.save_pretrained(tmp_path)  # another corpus: written
    assert len(hf_spec.AutoDrafter.from_pretrained(tmp_path).ngram_datastore) == len(prompt[0]) + 1
    drafter.ngram_datastore = None
    drafter.save_pretrained(tmp_path / "plain")
    assert hf_spec.AutoDrafter.from_pretrained(tmp_path / "plain").ngram_datastore is None
