"""N-gram datastore: corpus continuations for n-gram trees (NGramDrafter and ngram_nodes), lossless."""

import random

import pytest
import torch
from transformers import AutoModel

import hf_spec
from conftest import make_target, plain_generate, random_prompt
from hf_spec.drafters.datastore import DATASTORE_FILE, NGramDatastore
from hf_spec.drafters.ngram import FALLBACK_NODE_COST
from hf_spec.training.data import datastore_from_feature_cache
from test_sampling import (P_VALUE_FLOOR, VOCAB, chi_square_pvalue, exact_joint, rejects_colder_law, sample_batches,
                           warpers)  # fmt: skip


def brute_force(documents, suffix, max_depth):
    """Every continuation of ``suffix`` inside the documents, in corpus order."""
    n, out = len(suffix), []
    for doc in documents:
        for p in range(n, len(doc)):
            if doc[p - n : p] == suffix:
                out.append(doc[p : p + max_depth])
    return out


def test_lookup_equals_brute_force_and_never_crosses_documents():
    rng = random.Random(0)
    documents = [[rng.randrange(6) for _ in range(rng.randrange(1, 60))] for _ in range(40)]
    store = NGramDatastore.from_documents(documents, min_match=1, max_match=3)
    for _ in range(200):
        context = [rng.randrange(6) for _ in range(rng.randrange(1, 6))]
        found = list(store.continuations(context, max_depth=4, max_occurrences=10_000))
        for n in range(min(3, len(context)), 0, -1):
            expected = brute_force(documents, context[-n:], 4)
            got = [tokens for tokens, length in found if length == n]
            assert sorted(got) == sorted(expected)  # every occurrence, none across a document boundary
            assert store.occurrences(context[-n:]) == len(expected)
        lengths = [length for _, length in found]
        assert lengths == sorted(lengths, reverse=True)  # longest match first


def test_occurrences_are_spread_over_the_corpus_when_capped():
    documents = [[1, 2, 3]] * 90 + [[1, 2, 4]] * 10
    store = NGramDatastore.from_documents(documents, min_match=2, max_match=2)
    found = [tokens[0] for tokens, _ in store.continuations([1, 2], max_depth=1, max_occurrences=10)]
    assert len(found) == 10 and found.count(3) == 9 and found.count(4) == 1  # frequencies kept


def test_context_continuations_outrank_a_corpus_that_repeats_more_at_the_same_match_length():
    """At equal match length the text being written comes first, even where the corpus repeats its own phrase more
    often (an edit copies the function in its prompt, not a common idiom); a longer corpus match still wins."""
    from hf_spec.drafters.ngram import NGramIndex, continuations_with_datastore, scored_trie

    context = [8, 2, 3, 4, 5, 5, 9, 2, 3, 4]  # its longest earlier match: the 3 tokens 2 3 4, followed by 5

    def best_root(documents):
        index = NGramIndex(1, 4)
        index.extend(context)
        store = NGramDatastore.from_documents(documents, min_match=1, max_match=4)
        trie = scored_trie(continuations_with_datastore(index, store, 2, 16), num_nodes=4, max_depth=2, max_branches=4)
        return trie.tokens[trie.ranks.index(0)]

    assert best_root([[1, 2, 3, 4, 7, 7], [1, 2, 3, 4, 7, 8]]) == 5  # 2 3 4 -> 7 twice in the corpus, once 5 here
    assert best_root([[9, 2, 3, 4, 7, 7]]) == 7  # the corpus matches all 4 suffix tokens


def corpus_case(family="llama"):
    """A target, a short prompt, and a datastore holding the target's own greedy text from that prompt."""
    target = make_target(family)
    prompt = random_prompt(seed=1)
    text = plain_generate(target, prompt, max_new_tokens=50, do_sample=False)
    return target, prompt, NGramDatastore.from_documents([text[0].tolist()])


def test_ngram_drafter_with_datastore_matches_plain_and_drafts_from_the_corpus(family):
    target, prompt, store = corpus_case(family)
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    # a fixed node cost: tau compared across two sizings timed live would be a coin toss on a loaded machine
    alone = hf_spec.NGramDrafter(node_cost=FALLBACK_NODE_COST)
    with_store = hf_spec.NGramDrafter(datastore=store, node_cost=FALLBACK_NODE_COST)
    assert torch.equal(target.generate(prompt, assistant_model=alone, max_new_tokens=40, do_sample=False), expected)
    assert torch.equal(target.generate(prompt, assistant_model=with_store, max_new_tokens=40, do_sample=False), expected)
    assert with_store.last_generation_stats.tau > alone.last_generation_stats.tau + 0.5


def test_hybrid_with_datastore_matches_plain():
    target, prompt, store = corpus_case()
    drafter = hf_spec.EagleDrafter.from_target(target)  # untrained: the corpus branches do the work
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, ngram_nodes=8, max_new_tokens=40, do_sample=False)
    without = drafter.last_generation_stats.accepted_from_ngram
    assert torch.equal(out, expected)
    drafter.ngram_datastore = store
    out = target.generate(prompt, assistant_model=drafter, ngram_nodes=8, max_new_tokens=40, do_sample=False)
    assert torch.equal(out, expected)
    assert drafter.last_generation_stats.accepted_from_ngram > without


@pytest.mark.parametrize("warp", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9)], ids=str)
def test_sampled_distribution_equals_target(warp):
    """Corpus drafts are point masses fixed by the committed text: the sampled law is the target's."""
    target = make_target("llama", vocab_size=VOCAB, logit_scale=8.0, seed=3)
    prompt = random_prompt(length=4, vocab_size=VOCAB, seed=11)
    torch.manual_seed(0)
    corpus = [plain_generate(target, prompt, max_new_tokens=8, do_sample=True, top_k=None, **warp)[0].tolist()
              for _ in range(30)]  # fmt: skip
    drafter = hf_spec.NGramDrafter(max_depth=3, num_draft_tokens=16, node_cost=0,  # full trees: many accepts
                                       datastore=NGramDatastore.from_documents(corpus))
    exact = exact_joint(target, prompt, warpers(**warp))
    torch.manual_seed(1234)
    counts, stats = sample_batches(target, prompt, drafter, **warp)  # in batches of rows
    accepted = [length for s in stats for length in s.accepted_lengths]
    assert chi_square_pvalue(counts, exact) > P_VALUE_FLOOR
    assert rejects_colder_law(counts, target, prompt, warp)  # the test can fail
    assert sum(accepted) / len(accepted) > 0.5  # the context alone (4 random tokens) would draft almost nothing


def test_checkpoint_round_trip(tmp_path):
    target, _, store = corpus_case()
    drafter = hf_spec.EagleDrafter.from_target(target)
    drafter.ngram_datastore = store
    drafter.save_pretrained(tmp_path / "eagle")
    assert (tmp_path / "eagle" / DATASTORE_FILE).is_file()
    for loaded in (hf_spec.EagleDrafter.from_pretrained(tmp_path / "eagle"), AutoModel.from_pretrained(tmp_path / "eagle")):
        assert (loaded.ngram_datastore.tokens == store.tokens).all()
    assert (NGramDatastore.load(tmp_path / "eagle").tokens == store.tokens).all()  # what hf_spec:ngram:datastore= reads
    hf_spec.EagleDrafter.from_target(target).save_pretrained(tmp_path / "none")
    assert hf_spec.EagleDrafter.from_pretrained(tmp_path / "none").ngram_datastore is None


def test_bench_methods_with_and_without_the_datastore(tmp_path):
    from hf_spec.bench.harness import parse_method

    target, _, store = corpus_case()
    drafter = hf_spec.EagleDrafter.from_target(target)
    drafter.ngram_datastore = store
    drafter.save_pretrained(tmp_path)
    assert parse_method(f"hf_spec:{tmp_path}:ngram=8").generate_kwargs["assistant_model"].ngram_datastore is not None
    method = parse_method(f"hf_spec:{tmp_path}:ngram=8:no_datastore")
    assert method.generate_kwargs["assistant_model"].ngram_datastore is None and method.info["ngram_datastore"] is False
    method = parse_method(f"hf_spec:ngram:tokens=8:datastore={tmp_path}")
    assert (method.generate_kwargs["assistant_model"].ngram_datastore.tokens == store.tokens).all()
    with pytest.raises(ValueError, match="datastore"):
        parse_method(f"hf_spec:ngram:datastore={tmp_path / 'missing'}")


def test_datastore_from_a_feature_cache_holds_only_answer_tokens(tmp_path):
    import json

    from datasets import Dataset

    from hf_spec.training.data import _META_FILE

    Dataset.from_dict({"input_ids": [[5, 6, 7, 8, 9], [5, 6, 10, 11]],
                       "loss_mask": [[0, 0, 1, 1, 1], [0, 1, 1, 1]]}).save_to_disk(str(tmp_path / "shard-00000"))  # fmt: skip
    (tmp_path / _META_FILE).write_text(json.dumps({"storage": "bfloat16"}))
    store = datastore_from_feature_cache(tmp_path, min_match=1, max_match=2)
    assert store.tokens.tolist() == [7, 8, 9, -1, 6, 10, 11, -1]


def test_merged_datastores_find_every_corpus_and_never_cross_between_them():
    first, second = [[1, 2, 3, 4]], [[4, 5, 6], [1, 2, 7]]
    merged = NGramDatastore.merge([NGramDatastore.from_documents(first, 1, 2), NGramDatastore.from_documents(second, 1, 2)])
    found = sorted(tokens for tokens, length in merged.continuations([1, 2], max_depth=2, max_occurrences=100) if length == 2)
    assert found == [[3, 4], [7]]  # both corpora, nothing across documents
    assert merged.occurrences([4, 5]) == 1 and merged.occurrences([3, 4, 4]) == 0
    raw = NGramDatastore(torch.tensor([9, 8, 7]), 1, 2)  # a corpus without a final separator
    joined = NGramDatastore.merge([raw, NGramDatastore.from_documents([[7, 6]], 1, 2)])
    assert joined.occurrences([7, 7]) == 0 and joined.occurrences([7]) == 1 and joined.occurrences([9, 8]) == 1
    with pytest.raises(ValueError, match="match lengths"):
        NGramDatastore.merge([raw, NGramDatastore.from_documents(first, 2, 4)])
