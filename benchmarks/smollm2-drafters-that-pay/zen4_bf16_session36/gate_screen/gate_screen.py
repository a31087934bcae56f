"""Screen for an online drafter gate in the hybrids (issue #14): would skipping the drafter forward on cycles where
it has recently added little pay? Offline, from one instrumented greedy run per prompt (shipped folder, bf16,
2 threads, 128 new tokens), as session 34's context_match/buckets.py: on every drafted cycle, the tokens the hybrid
tree committed (h), the tokens the 8-node n-gram trie alone would have committed (n: the committed tokens' longest
path through it + the bonus token, exact under greedy), the cycle's seconds and its drafting seconds; drafter-free
cycles (copy / context match) are kept as they are. Policies are then replayed over the same cycle sequence
(tokens / seconds pooled; a gated cycle yields n tokens and costs its seconds minus the drafting seconds):

- always: the shipped hybrid; never: the trie alone on every drafted cycle (about NGramDrafter + datastore);
- oracle: per cycle the better of the two (a ceiling no online rule reaches);
- gate(alpha, probe): skip the drafter while an EMA of the drafter's added tokens per drafted cycle, (h - n) on the
  cycles that ran it, is worth less than its drafting time at the current ms per token; run it every PROBE-th cycle
  anyway to keep the estimate fresh. Uses only past cycles, so a real gate would stay lossless.

    python gate_screen.py DRAFTER SKIP LIMIT DATASET...
"""
import collections, itertools, os, sys, time
import torch
from transformers import AutoModel
from hf_spec.bench.harness import build_prompts
from hf_spec.drafters.eagle import EagleDraftingSession
from hf_spec.drafters.ngram import TrieNodes, build_trie, continuations_with_datastore, trie_to_draft_tree
from hf_spec.drafters.parallel import ParallelDraftingSession
from hf_spec.resources import load_packaged_model

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../ngram_policy"))
from sim import accepted_length  # noqa: E402

NODES = 8
pending, cycles = {}, []  # cycles: (drafted, h, n, seconds, drafting seconds)


def trie_accepts(trie, committed):
    """Tokens of ``committed`` the trie drafts in a row from its root (the n-gram replay's walk)."""
    return accepted_length(trie_to_draft_tree(0, trie), committed)


def make_propose(original):
    def propose(self, features, next_tokens):
        start = time.perf_counter()
        last = pending.pop(id(self), None)
        committed = next_tokens.tolist()
        if last is not None:
            trie, began, drafting_before, overhead = last
            n = trie_accepts(trie, committed) + 1 if trie is not None else len(committed)
            cycles.append((trie is not None, len(committed), n, start - began - overhead,
                           self.forward_seconds - drafting_before))
        skipped, drafting_before = self.skipped_cycles, self.forward_seconds
        tree = original(self, features, next_tokens)
        t = time.perf_counter()
        trie = None
        if self.skipped_cycles == skipped and self._ngram is not None:  # drafted: what would the trie alone do?
            ng, depth = self._ngram, max(self.shape.depth, self.drafter.config.ngram_depth or 0)
            conts = continuations_with_datastore(ng.index, ng.datastore, depth, ng.max_occurrences)
            first = next(conts, None)
            trie = build_trie(itertools.chain([first], conts), NODES, depth, self.shape.top_k) if first else TrieNodes()
        pending[id(self)] = (trie, start, drafting_before, time.perf_counter() - t)
        return tree

    return propose


def replay(rows, policy):
    tokens = seconds = 0.0
    ema, since_probe = None, 0
    for drafted, h, n, sec, dra in rows:
        if not drafted:
            tokens, seconds = tokens + h, seconds + sec
            continue
        if policy == "always":
            run = True
        elif policy == "never":
            run = False
        elif policy == "oracle":
            run = h / sec > n / (sec - dra)
        else:
            alpha, probe = policy
            ms_per_token = seconds / tokens if tokens else sec / h
            run = ema is None or since_probe + 1 >= probe or ema * ms_per_token > dra
        if run:
            tokens, seconds = tokens + h, seconds + sec
            if policy not in ("always", "never", "oracle"):
                ema = (h - n) if ema is None else (1 - alpha) * ema + alpha * (h - n)
                since_probe = 0
        else:
            tokens, seconds = tokens + n, seconds + sec - dra
            since_probe += 1
    return tokens, seconds


name, skip, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for cls in (EagleDraftingSession, ParallelDraftingSession):
    cls.propose = make_propose(cls.propose)
model, tok = load_packaged_model("smollm2-135m-instruct", dtype=torch.bfloat16)
torch.set_num_threads(2)
drafter = AutoModel.from_pretrained(f"drafters/smollm2-135m-instruct-{name}").eval()
policies = ["always", "never", "oracle", (0.3, 4), (0.3, 8), (0.5, 4), (0.1, 8)]
for ds in sys.argv[4:]:
    per_prompt = []
    for p in build_prompts(tok, [ds], limit=limit, skip=skip)[ds]:
        cycles.clear()
        model.generate(torch.tensor([p["input_ids"]]), max_new_tokens=128, do_sample=False, assistant_model=drafter)
        pending.clear()
        per_prompt.append(list(cycles))
    totals = {str(pol): [0.0, 0.0] for pol in policies}
    for rows in per_prompt:
        for pol in policies:
            t, s = replay(rows, pol)
            totals[str(pol)][0] += t; totals[str(pol)][1] += s
    base = totals["always"][0] / totals["always"][1]
    drafted = [r for rows in per_prompt for r in rows if r[0]]
    print(f"{name} {ds} {skip}..{skip + limit - 1}: {sum(map(len, per_prompt))} cycles, {len(drafted)} drafted, "
          f"drafter adds {sum(r[1] - r[2] for r in drafted) / len(drafted):+.2f} tokens per drafted cycle, "
          f"drafting {1000 * sum(r[4] for r in drafted) / len(drafted):.1f} ms of "
          f"{1000 * sum(r[3] for r in drafted) / len(drafted):.1f}", flush=True)
    print("  " + "  ".join(f"{k}: {v[0] / v[1] / base:.3f}" for k, v in totals.items()), flush=True)
