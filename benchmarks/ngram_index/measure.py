"""Per-cycle cost of hf_spec.NGramDrafter's index update and proposal at 256 and 4,096 tokens of context.

The n-gram drafter keeps an incremental hashed index of prompt + generated tokens
(:class:`hf_spec.drafters.ngram.NGramIndex`); each decoding cycle adds the newly committed tokens
and drafts a trie of continuations. This script times, on a synthetic token stream (random
tokens with copied earlier segments, so suffixes do match), per cycle:

- ``index_update``: ``NGramIndex.extend`` of the cycle's committed tokens alone;
- ``propose``: the whole ``NGramDraftingSession.propose`` (update + continuation search + trie +
  DraftTree), what the decoding loop pays per cycle.

Each context length gets fresh sessions prefilled to that length, then ``--cycles`` cycles of
``--commit`` tokens each (so the context stays within ``commit x cycles`` of the nominal length),
repeated ``--repeats`` times; medians (and p10/p90) over all cycles. No target model runs.

    python benchmarks/ngram_index/measure.py            # full run (about a minute of CPU)
    python benchmarks/ngram_index/measure.py --quick    # a 5-second smoke run

Writes results.json and results.md (command, machine, date) next to this script, or to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

import hf_spec
from hf_spec.drafters.ngram import NGramIndex


def synthetic_stream(length: int, vocab_size: int, seed: int) -> list[int]:
    """Random tokens, half of the time a copy of an earlier 8-32 token segment (repetitive text)."""
    rng = random.Random(seed)
    out: list[int] = []
    while len(out) < length:
        if len(out) > 64 and rng.random() < 0.5:
            span = rng.randint(8, 32)
            start = rng.randrange(0, len(out) - span)
            out.extend(out[start : start + span])
        else:
            out.extend(rng.randrange(1, vocab_size) for _ in range(rng.randint(4, 16)))
    return out[:length]


def quantiles(samples_ns: list[int]) -> dict:
    us = sorted(s / 1000.0 for s in samples_ns)
    pick = lambda q: us[min(len(us) - 1, int(q * len(us)))]  # noqa: E731
    return {"median_us": statistics.median(us), "p10_us": pick(0.10), "p90_us": pick(0.90),
            "mean_us": statistics.fmean(us), "cycles": len(us)}  # fmt: skip


def measure(context: int, args) -> dict:
    drafter = hf_spec.NGramDrafter()
    shape = drafter.tree_shape()
    config = drafter.config
    update_ns: list[int] = []
    propose_ns: list[int] = []
    for repeat in range(args.repeats):
        stream = synthetic_stream(context + args.commit * args.cycles + 1, args.vocab_size, seed=repeat)
        prompt = torch.tensor([stream[:context]])
        # the index update alone
        index = NGramIndex(config.min_match, config.max_match)
        index.extend(stream[:context])
        for cycle in range(args.cycles):
            new = stream[context + cycle * args.commit : context + (cycle + 1) * args.commit]
            begin = time.perf_counter_ns()
            index.extend(new)
            update_ns.append(time.perf_counter_ns() - begin)
        # the whole per-cycle proposal (first call: the prompt after its first token, as the loop does)
        session = drafter.new_drafting_session(None, shape, do_sample=False, prompt_ids=prompt)
        session.propose(None, torch.tensor(stream[1 : context + 1]))
        for cycle in range(args.cycles):
            start = context + 1 + cycle * args.commit
            new = torch.tensor(stream[start : start + args.commit])
            begin = time.perf_counter_ns()
            session.propose(None, new)
            propose_ns.append(time.perf_counter_ns() - begin)
    return {"context_tokens": context, "index_update": quantiles(update_ns), "propose": quantiles(propose_ns)}


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "hf_spec": getattr(hf_spec, "__version__", None),
            "load_average_1_5_15min": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}  # fmt: skip


def write_markdown(path: Path, record: dict) -> None:
    lines = ["# NGramDrafter per-cycle cost by context length", "",
             f"- command: `{record['command']}`", f"- date (UTC): {record['date_utc']}",
             f"- machine: {record['machine']['platform']}, {record['machine']['cpu_count']} CPUs, "
             f"torch {record['machine']['torch']} ({record['machine']['torch_threads']} threads), "
             f"load average {record['machine']['load_average_1_5_15min']}",
             f"- settings: {record['settings']}" + (" (**quick smoke run, not a measurement**)" if record["settings"]["quick"] else ""),
             "", "| context tokens | index update median (us) | p10 | p90 | propose median (us) | p10 | p90 | cycles |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for row in record["results"]:
        u, p = row["index_update"], row["propose"]
        lines.append(f"| {row['context_tokens']} | {u['median_us']:.1f} | {u['p10_us']:.1f} | {u['p90_us']:.1f} | "
                     f"{p['median_us']:.1f} | {p['p10_us']:.1f} | {p['p90_us']:.1f} | {p['cycles']} |")  # fmt: skip
    lines += ["", "index update: `NGramIndex.extend` of one cycle's committed tokens; propose: the whole "
              "`NGramDraftingSession.propose` (update + continuation search + trie + DraftTree). Medians over all cycles.", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 4096], help="context lengths in tokens")
    parser.add_argument("--commit", type=int, default=3, help="tokens committed per cycle (an accepted length)")
    parser.add_argument("--cycles", type=int, default=50, help="timed cycles per fresh session")
    parser.add_argument("--repeats", type=int, default=40, help="fresh sessions per context length")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--quick", action="store_true", help="a few-second smoke run (5 sessions of 20 cycles)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent, help="output directory")
    args = parser.parse_args(argv)
    if args.quick:
        args.cycles, args.repeats = 20, 5
    torch.set_num_threads(1)
    results = [measure(context, args) for context in args.contexts]
    record = {
        "command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": {"commit": args.commit, "cycles": args.cycles, "repeats": args.repeats,
                     "vocab_size": args.vocab_size, "quick": args.quick, "stream": "synthetic (random + copied segments)"},  # fmt: skip
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    write_markdown(args.out / "results.md", record)
    for row in results:
        print(f"context {row['context_tokens']:>5}: index update median {row['index_update']['median_us']:.1f} us, "
              f"propose median {row['propose']['median_us']:.1f} us ({row['propose']['cycles']} cycles)")


if __name__ == "__main__":
    main()
