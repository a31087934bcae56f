"""Long generation on the real SmolLM2 (nightly: ``-m slow``): 4096 new tokens with the demo's
shipped drafter in fp32 equal plain generate() token for token, the target's KV cache never holds
more than the committed tokens plus one draft tree, and the process memory stays flat.
Recorded run: benchmarks/long_generation/README.md."""

import json
import os
import time

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

import hf_spec
from conftest import plain_generate
from hf_spec.demo import DEFAULT_TARGET, shipped_drafter_path

pytestmark = [pytest.mark.slow, pytest.mark.integration]

NEW_TOKENS = int(os.environ.get("HF_SPEC_LONG_TOKENS", 4096))
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


class RssSampler(StoppingCriteria):
    """Never stops; records (tokens generated, RSS MB) every ``every`` new tokens."""

    def __init__(self, prompt_len: int, every: int = 256):
        self.prompt_len, self.every, self.samples, self.next = prompt_len, every, [], 0

    def __call__(self, input_ids, scores, **kwargs):
        generated = input_ids.shape[1] - self.prompt_len
        if generated >= self.next:
            self.samples.append((generated, round(rss_mb(), 1)))
            self.next = generated + self.every
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def test_4k_tokens_identical_to_plain_with_flat_memory():
    model, tokenizer = hf_spec.load_packaged_model(DEFAULT_TARGET, dtype=torch.float32)
    drafter = hf_spec.EagleDrafter.from_pretrained(shipped_drafter_path(DEFAULT_TARGET), dtype=torch.float32)
    messages = [{"role": "user", "content": "Write a very long story about a lighthouse keeper, chapter by chapter."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]  # fmt: skip
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)  # no EOS before 4096

    start = time.perf_counter()
    expected = plain_generate(model, ids, **kwargs)
    plain_seconds = time.perf_counter() - start

    cache_peaks = []  # (cache length before a target forward) + (tokens in it)
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model

    def record(module, args, kw):
        cache = kw.get("past_key_values")
        tokens = kw["input_ids"].shape[1] if kw.get("input_ids") is not None else 0
        cache_peaks.append((cache.get_seq_length() if cache is not None else 0) + tokens)

    hook = base.register_forward_pre_hook(record, with_kwargs=True)
    sampler = RssSampler(ids.shape[1], every=max(NEW_TOKENS // 16, 1))
    try:
        start = time.perf_counter()
        out = model.generate(ids, assistant_model=drafter, return_dict_in_generate=True,
                             stopping_criteria=StoppingCriteriaList([sampler]), **kwargs)  # fmt: skip
        spec_seconds = time.perf_counter() - start
    finally:
        hook.remove()

    stats = drafter.last_generation_stats
    sequences = out.sequences
    first_diff = next((i for i in range(expected.shape[1]) if sequences[0, i] != expected[0, i]), None)
    tree_bound = drafter.tree_shape().total_tokens + 1
    rss = sampler.samples
    warm = [mb for generated, mb in rss if generated >= NEW_TOKENS // 8]
    report = {
        "new_tokens": sequences.shape[1] - ids.shape[1], "prompt_tokens": ids.shape[1],
        "identical_to_plain": first_diff is None, "first_difference_at": first_diff,
        "final_cache_length": out.past_key_values.get_seq_length(), "sequence_length": sequences.shape[1],
        "max_cache_plus_forward_tokens": max(cache_peaks), "tree_tokens_bound": tree_bound,
        "rss_mb_samples": rss, "rss_growth_after_warmup_mb": (max(warm) - min(warm)) if warm else None,
        "tau": stats.tau, "cycles": stats.cycles, "plain_seconds": plain_seconds, "spec_seconds": spec_seconds,
        "torch_threads": torch.get_num_threads(),
    }  # fmt: skip
    print("\n" + json.dumps(report))
    out_path = os.environ.get("HF_SPEC_LONG_REPORT")
    if out_path:
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1)

    assert first_diff is None, report
    # no cache growth beyond accepted tokens: after the loop it holds exactly the committed tokens
    assert report["final_cache_length"] == sequences.shape[1] - 1
    # during the loop it never held more than the committed tokens plus one draft tree
    assert max(cache_peaks) <= sequences.shape[1] + tree_bound
    # memory flat: the KV cache grows 2*30 layers*3 kv heads*64 dims*4 bytes = 45 KB per token in fp32
    # (180 MB at 4k); beyond that, growth after warm-up stays under 1.5x the cache's own size
    cache_mb = 2 * 30 * 3 * 64 * 4 * NEW_TOKENS / 2**20
    assert len(warm) >= 2 and report["rss_growth_after_warmup_mb"] < 1.5 * cache_mb + 200, report
