"""The speed controller's bounds on the packaged SmolLM2-135M-Instruct: worst case and best case.

- **Worst case**: a randomly initialised drafter (the HASS folder's architecture and shape candidates, its
  weights re-drawn, no n-gram branches: acceptance ~0) through the default controller, against plain greedy
  ``generate()``. The controller must fall back to plain steps and cost little. On a CPU
  the reference that isolates the controller is plain ``generate()`` inside ``hf_spec.few_row_linears`` and
  ``hf_spec.few_query_attention`` (the kernels every hf-spec call decodes with; ``plain_few_row``), timed beside
  plain.
- **Best case**: an oracle drafter that proposes a chain of the target's own next ``--oracle-depth`` tokens (read
  from a plain greedy run of the same prompt; no drafting cost) through the default controller. Its speed should
  be what its tau predicts: tau tokens per cycle at the cost of one verification of ``depth + 1`` tokens,
  predicted = plain_few_row tokens/s x tau x t(1) / t(depth + 1), with t(k) the timed target forward of k new
  tokens on a cached prompt (``transformers`` calls inside the same two blocks).

Each prompt runs ``--repeats`` rounds of every method once, who goes first rotating; each method keeps its fastest
round, and the worst case is also read paired: per prompt the median over rounds of the random drafter's time
against ``plain_few_row``'s in the same round (a machine whose speed drifts between rounds moves both), and
within the call: each drafted cycle's tokens at the median time of the plain cycles around it, plus the plain
cycles' own time, over the time of all the call's cycles (drift between calls and slow spells within one move
both; the prefill is left out, and so is any difference between the loop's plain step and ``generate()``'s, which
the paired reading keeps). The within-call readings are also kept in the order the calls ran, and read over the
second half of the calls: what a useless drafter costs once the controller's start (a cold first call, then a few
probe cycles per call until drafting has its evidence) is behind it.

One process, one fresh controller per drafter (cold: nothing on disk is read). Public API only.

    python benchmarks/controller_bounds/run.py --dtype float32 --prompts 8 --out benchmarks/controller_bounds/float32
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache

import hf_spec
from hf_spec import DraftingSession, dtype_name, resolve_dtype

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [  # written for this benchmark; no tuning or default used them
    "Describe how a bicycle gear system works and when a rider should change gear.",
    "Write a Python function that returns the n-th prime number, with a docstring and two examples.",
    "A shop sells pencils in packs of 12 for $3.60. How much do 90 pencils cost? Show your steps.",
    "Rewrite this sentence in the passive voice, then explain the change: The committee approved the new budget.",
    "Write a SQL query that lists every department with more than ten employees, largest first.",
    "Give three tips for keeping houseplants alive in winter, one paragraph each.",
    "Explain the difference between a list and a tuple in Python, with a short code example of each.",
    "A car uses 6.5 litres of fuel per 100 km. How much fuel does a 340 km trip need? Show your steps.",
    "Summarise the plot of a story in which a lighthouse keeper finds a message in a bottle, in four sentences.",
    "Convert the temperatures 0, 37 and 100 degrees Celsius to Fahrenheit and show the formula.",
]


WARMUP = "Name three rivers in Europe and one city on each."


class OracleConfig(hf_spec.SpecDrafterConfig):
    model_type = "hf_spec_bounds_oracle"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)


class OracleSession(DraftingSession):
    """Drafts a chain of the reference's next ``depth`` tokens after the root."""

    def __init__(self, reference: torch.Tensor, depth: int):
        self.reference, self.depth, self.length = reference, depth, 1  # the prompt's first token is committed

    def propose(self, features, next_tokens):
        self.length += int(next_tokens.shape[0])
        drafts = self.reference[self.length : self.length + self.depth]
        return hf_spec.DraftTree.chain(next_tokens[-1], drafts.to(next_tokens.device))


class OracleDrafter(hf_spec.SpecDrafterModel):
    """A weightless drafter that knows the target's greedy continuation (``reference``: prompt + continuation)."""

    config_class = OracleConfig

    def __init__(self, config: OracleConfig, depth: int):
        super().__init__(config)
        self.depth, self.reference = depth, None

    def bind(self, target):
        self._borrowed = (target.get_input_embeddings(), target.get_output_embeddings())
        self._bound_target_config = target.config
        return self

    def new_drafting_session(self, target, shape, do_sample, temperature=1.0, prompt_ids=None):
        return OracleSession(self.reference.to(target.device), self.depth)


def random_drafter(target) -> hf_spec.EagleDrafter:
    """The HASS folder's drafter with re-drawn weights and n-gram branches off (acceptance ~0)."""
    config = hf_spec.EagleDrafterConfig.from_pretrained(REPO / "drafters" / "smollm2-135m-instruct-hass")
    config.ngram_nodes, config.ngram_cost_gate = 0, False
    config.tree_shape_candidates = [{**c, "ngram_nodes": 0} for c in config.tree_shape_candidates]
    torch.manual_seed(0)
    return hf_spec.EagleDrafter(config).to(target.dtype).eval().bind(target)


@torch.no_grad()
def forward_ms(model, prompt: torch.Tensor, k: int, repeats: int = 15) -> float:
    """Median ms of one target forward of ``k`` new tokens on top of the cached prompt."""
    cache = DynamicCache()
    model(prompt, past_key_values=cache, use_cache=True)
    length = prompt.shape[1]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(prompt[:, :k] if k <= length else prompt[:, :1].repeat(1, k), past_key_values=cache, use_cache=True)
        times.append(1000.0 * (time.perf_counter() - start))
        cache.crop(-k)  # transformers 5: a negative count drops that many tokens
    return statistics.median(times)


def within_call(stats, nearest: int = 8) -> float | None:
    """What plain steps would have cost over what the call's cycles cost, both read in the call itself: each drafted
    cycle's tokens at the median time of the ``nearest`` plain cycles around it, plus the plain cycles' own time,
    over the time of all cycles (None: no plain cycle). A machine whose speed drifts between calls, or within one in
    spells, moves both sides."""
    times, arms = stats.cycle_seconds, stats.arm_per_cycle
    plain = [i for i, arm in enumerate(arms) if arm == 0]
    if not plain:
        return None
    would = 0.0
    for i, (seconds, arm) in enumerate(zip(times, arms)):
        if arm == 0:
            would += seconds
        else:
            near = sorted(plain, key=lambda j: abs(j - i))[:nearest]
            would += (stats.accepted_lengths[i] + 1) * statistics.median(times[j] for j in near)
    return would / sum(times)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="auto", help="auto (bf16 where the CPU computes it natively), float32, bfloat16")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--oracle-depth", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2,
                        help="rounds per prompt (every method once, who goes first rotating); fastest kept, and paired")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    dtype = dtype_name(resolve_dtype(args.dtype))
    target, tokenizer = hf_spec.load_packaged_model("smollm2-135m-instruct", dtype=getattr(torch, dtype))
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                             return_tensors="pt", return_dict=True)["input_ids"]
               for p in PROMPTS[: args.prompts]]  # fmt: skip
    common = dict(max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens, do_sample=False)
    randomly = random_drafter(target)
    oracle = OracleDrafter(OracleConfig(**hf_spec.SpecDrafterConfig.target_fields(target.config)), args.oracle_depth)
    oracle.bind(target)
    warm = tokenizer.apply_chat_template([{"role": "user", "content": WARMUP}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)["input_ids"]  # fmt: skip
    oracle.reference = target.generate(warm, **common)[0]  # untimed warm-up of every path, on a prompt not timed
    target.generate(warm, assistant_model=oracle, speed_controller=False, **common)
    with hf_spec.few_row_linears(target), hf_spec.few_query_attention():
        target.generate(warm, **common)
    target.generate(warm, assistant_model=randomly, speed_controller=False, **common)

    def plain_few_row():
        with hf_spec.few_row_linears(target), hf_spec.few_query_attention():
            return target.generate(prompt, **common)

    methods = {"plain": lambda: target.generate(prompt, **common), "plain_few_row": plain_few_row,
               "random": lambda: target.generate(prompt, assistant_model=randomly, **common),
               "oracle": lambda: target.generate(prompt, assistant_model=oracle, **common)}  # fmt: skip
    drafters = {"random": randomly, "oracle": oracle}
    rows, turn = [], 0
    for i, prompt in enumerate(prompts):
        oracle.reference = target.generate(prompt, **common)[0]  # the oracle's chain: plain greedy
        rounds = {name: [] for name in methods}
        best, outputs, own = {}, {}, []
        for _ in range(args.repeats):  # every method once per round, who goes first rotating
            names = list(methods)[turn % len(methods):] + list(methods)[: turn % len(methods)]
            turn += 1
            for name in names:
                out, seconds = timed(methods[name])
                rounds[name].append(seconds)
                if name not in best or seconds < best[name][0]:  # the stats of the call whose time is kept
                    best[name] = (seconds, getattr(drafters.get(name), "last_generation_stats", None))
                outputs[name] = out
                if name == "random":
                    own.append(within_call(randomly.last_generation_stats))
        rand_stats, orac_stats = best["random"][1], best["oracle"][1]
        plain, new = outputs["plain"], outputs["plain"].shape[1] - prompt.shape[1]
        paired = [few / rand for few, rand in zip(rounds["plain_few_row"], rounds["random"])]
        rows.append({"prompt": i, "new_tokens": new, "plain_s": best["plain"][0],
                     "plain_few_row_s": best["plain_few_row"][0], "random_s": best["random"][0],
                     "oracle_s": best["oracle"][0], "seconds_by_round": rounds,
                     "random_over_plain_few_row_paired": statistics.median(paired),
                     "random_within_call_by_round": own,
                     "random_within_call": statistics.median([x for x in own if x is not None] or [math.nan]),
                     "random_identical": bool(torch.equal(outputs["random"], plain)),
                     "oracle_identical": bool(torch.equal(outputs["oracle"], plain)),
                     "few_row_identical": bool(torch.equal(outputs["plain_few_row"], plain)),
                     "random_tau": rand_stats.tau, "oracle_tau": orac_stats.tau,
                     "random_plain_cycles": rand_stats.arm_per_cycle.count(0) / max(rand_stats.cycles, 1),
                     "oracle_plain_cycles": orac_stats.arm_per_cycle.count(0) / max(orac_stats.cycles, 1)})  # fmt: skip
        r = rows[-1]
        print(f"[{i + 1}/{len(prompts)}] plain_few_row x{r['plain_s'] / r['plain_few_row_s']:.3f}; over "
              f"plain_few_row: random x{r['plain_few_row_s'] / r['random_s']:.3f} (paired by round "
              f"x{r['random_over_plain_few_row_paired']:.3f}, within the call x{r['random_within_call']:.3f}, "
              f"plain cycles {r['random_plain_cycles']:.0%}), oracle "
              f"x{r['plain_few_row_s'] / r['oracle_s']:.2f} tau {r['oracle_tau']:.2f}", flush=True)  # fmt: skip

    with hf_spec.few_row_linears(target), hf_spec.few_query_attention():
        t1 = forward_ms(target, prompts[0], 1)
        tk = forward_ms(target, prompts[0], args.oracle_depth + 1)
    total = {k: sum(r[k] for r in rows) for k in ("plain_s", "plain_few_row_s", "random_s", "oracle_s", "new_tokens")}
    oracle_tau = sum(r["oracle_tau"] for r in rows) / len(rows)
    calls = [x for r in rows for x in r["random_within_call_by_round"]]  # the random drafter's calls, in order
    result = {
        "machine": {"cpu": hf_spec.cpu_name(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__, "dtype": dtype,
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},  # fmt: skip
        "max_new_tokens": args.max_new_tokens, "oracle_depth": args.oracle_depth, "repeats": args.repeats,
        "plain_few_row_over_plain": total["plain_s"] / total["plain_few_row_s"],
        "random_over_plain": total["plain_s"] / total["random_s"],
        "random_over_plain_few_row": total["plain_few_row_s"] / total["random_s"],
        "random_over_plain_few_row_worst_prompt": min(r["plain_few_row_s"] / r["random_s"] for r in rows),
        "random_over_plain_few_row_paired": statistics.geometric_mean(
            [r["random_over_plain_few_row_paired"] for r in rows]),  # per prompt: the median over rounds
        "random_within_call": statistics.geometric_mean([r["random_within_call"] for r in rows]),
        "random_within_call_by_call": calls,
        "random_within_call_second_half": statistics.geometric_mean(
            [x for x in calls[len(calls) // 2:] if x is not None] or [math.nan]),  # after the controller's start
        "random_over_plain_few_row_after_first": (sum(r["plain_few_row_s"] for r in rows[1:])
                                                  / sum(r["random_s"] for r in rows[1:]) if len(rows) > 1 else math.nan),
        "oracle_over_plain": total["plain_s"] / total["oracle_s"],
        "oracle_over_plain_few_row": total["plain_few_row_s"] / total["oracle_s"],
        "oracle_tau": oracle_tau,
        "forward_ms_1": t1, f"forward_ms_{args.oracle_depth + 1}": tk,
        "oracle_predicted_over_plain_few_row": oracle_tau * t1 / tk,
        "all_identical": all(r["random_identical"] and r["oracle_identical"] and r["few_row_identical"] for r in rows),
        "rows": rows,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "results.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
