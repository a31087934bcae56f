"""Fresh-machine benchmark (issue 40, "Must show"): what a new user gets from hf-spec, cold, on this machine.

Times plain greedy, transformers' prompt lookup, ``NGramDrafter()`` and every shipped SmolLM2 drafter folder in one
interleaved run on prompts written for this script only (no tuning, candidate measurement or default choice uses
them), with hf-spec's speed caches empty at start. Public API only. See benchmarks/fresh_machine/README.md.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = "smollm2-135m-instruct"
WARMUP_PROMPT = "List three things to pack for a one-day hike and say why each one matters."  # not in PROMPTS

_MATRIX = "def mean_rows(matrix):\n    out = []\n    for row in matrix:\n        out.append(sum(row) / len(row))\n    return out\n"
_INVENTORY = ("class Inventory:\n    def __init__(self):\n        self.items = {}\n\n    def add(self, name, count):\n"
              "        self.items[name] = self.items.get(name, 0) + count\n\n    def remove(self, name, count):\n"
              "        if self.items.get(name, 0) < count:\n            raise ValueError('not enough ' + name)\n"
              "        self.items[name] -= count\n")  # fmt: skip
PROMPTS = [  # (kind, prompt): written for this benchmark, never used by any tuning or default choice
    ("chat", "Why do onions make people cry when they are cut, and what are two ways to avoid it?"),
    ("chat", "Explain to a twelve-year-old what a leap year is and why the calendar needs one."),
    ("code", "Write a Python function `merge_intervals(intervals)` that merges overlapping [start, end] pairs and "
             "returns them sorted. Include a short docstring and one example call."),
    ("code", "Write a Python class `Stopwatch` with start(), stop() and elapsed() methods using time.perf_counter, "
             "and show how to use it to time a loop."),
    ("code", "Write a bash script that counts the lines of every .txt file in the current folder and prints the "
             "total at the end."),
    ("math", "A bakery sells muffins at $3 each and cookies at $1.25 each. Maya buys 4 muffins and 6 cookies and "
             "pays with a $20 bill. How much change does she get? Show your steps."),
    ("math", "A water tank holds 1,200 litres. It is 35% full, and a pump adds 90 litres every 10 minutes. How long "
             "until the tank is full? Show your steps."),
    ("edit", "Rewrite this Python function with type hints and a docstring, keeping its behaviour:\n\n" + _MATRIX),
    ("edit", "Rename the method `remove` to `take` in this class and make it return the remaining count; give the "
             "whole class back:\n\n" + _INVENTORY),
    ("edit", "Fix the grammar and spelling of this email without changing its meaning:\n\nHi Tom, i wanted to let "
             "you knows that the meeting on thursday have been moved to friday at 3pm. Please bring the report "
             "we was discussing, and let me know if their is any problems. Thanks, Ana"),
    ("summary", "Summarise this paragraph in two sentences:\n\nThe town library started lending tools in 2019: "
                "drills, ladders, sewing machines and garden equipment. Members borrow them for a week with the "
                "same card they use for books. In the first year more than 2,000 tools went out, most often "
                "ladders and pressure washers, and the library says the scheme brought in many people who had not "
                "visited for years. Volunteers repair returned tools on Saturday mornings, and local shops donate "
                "spare parts."),
    ("summary", "Give a one-sentence summary and then three bullet points for this text:\n\nBees communicate the "
                "location of food with a waggle dance. The angle of the dance relative to vertical shows the "
                "direction of the food relative to the sun, and the length of the waggle run shows the distance. "
                "Other bees follow the dancer, smell the nectar she brought back, and then fly out on their own. "
                "The dance changes through the day as the sun moves, so bees must keep track of time."),
    ("convert", "Convert this list into a JSON array of objects with keys name, role and start_year:\n\n"
                "- Priya Nair, backend engineer, since 2018\n- Lucas Ferreira, designer, since 2021\n"
                "- Chen Wei, data analyst, since 2016\n- Amara Okafor, product manager, since 2020"),
    ("convert", "Write a SQL query for this request. Tables: orders(id, customer_id, total, created_at) and "
                "customers(id, name, country). Request: the name and total spending of the five customers from "
                "Canada who spent the most in 2024, highest first."),
]
KINDS = list(dict.fromkeys(kind for kind, _ in PROMPTS))


def cold_cache(keep: bool) -> str:
    """Point HF_SPEC_CACHE at a fresh temporary folder (before hf_spec is imported) whose ``models/`` links to the
    persistent cache's, so the converted target is reused and every timing/cost cache starts empty."""
    if keep:
        return "kept: " + (os.environ.get("HF_SPEC_CACHE") or "~/.cache/hf_spec")
    # same resolution as hf_spec.resources.cache_dir(), written out because hf_spec must not be imported yet
    persistent = Path(os.environ.get("HF_SPEC_CACHE") or Path.home() / ".cache" / "hf_spec").expanduser()
    (persistent / "models").mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix="hf_spec_cold_cache_"))
    (fresh / "models").symlink_to(persistent / "models", target_is_directory=True)
    atexit.register(shutil.rmtree, fresh, True)  # removes the link, not the models it points to
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `timeout`/kill still runs the clean-up
    os.environ["HF_SPEC_CACHE"] = str(fresh)
    return f"cold: {fresh} (models/ linked to {persistent / 'models'})"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="target dtype; auto = what `hf-spec demo --dtype auto` picks (bf16 on a CPU with native "
                        "bf16, else float32)")  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=128, help="greedy tokens per generation (default 128)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed runs per prompt and method, fastest kept (default 3: a shared machine has slow spells "
                        "of seconds, and both of two runs of a method can meet one)")  # fmt: skip
    p.add_argument("--methods", default=None,
                   help="comma-separated subset of plain,plain_few_row,prompt_lookup,ngram,eagle,hass,coral,"
                        "parallelspec (default all; plain is always run: it is the reference)")  # fmt: skip
    p.add_argument("--prompts", type=int, default=None, help="use only the first N prompts (smoke tests)")
    p.add_argument("--keep-cache", action="store_true",
                   help="use hf-spec's existing cache (HF_SPEC_CACHE or ~/.cache/hf_spec) instead of a cold one")
    p.add_argument("--out", default=None,
                   help="results folder (default benchmarks/fresh_machine/results/<dtype>_<UTC timestamp>)")
    return p.parse_args()


def build_methods(hf_spec, model, wanted):
    """{name: (generate kwargs, drafter or None)}; drafters loaded fresh from the shipped folders. ``plain_few_row``
    is plain ``generate()`` inside ``hf_spec.few_row_linears(model)`` and ``hf_spec.few_query_attention()``: the
    kernel choices every hf-spec method decodes with on a CPU, without any drafting, so the table separates what
    drafting adds."""
    folders = {f.name[len(TARGET) + 1:]: f for f in sorted((REPO / "drafters").glob(f"{TARGET}-*"))
               if (f / "config.json").is_file()}  # fmt: skip
    known = ["plain", "plain_few_row", "prompt_lookup", "ngram", *folders]
    if wanted is not None and not wanted <= set(known):
        raise SystemExit(f"unknown method(s) {sorted(wanted - set(known))}; known: {','.join(known)}")
    methods = {}
    for name in known:
        if wanted is not None and name not in wanted and name != "plain":
            continue
        if name in ("plain", "plain_few_row"):
            methods[name] = ({}, None)
        elif name == "prompt_lookup":
            methods[name] = ({"prompt_lookup_num_tokens": 10}, None)
        else:
            drafter = hf_spec.NGramDrafter() if name == "ngram" else hf_spec.AutoDrafter.from_pretrained(
                folders[name], target=model)  # fmt: skip
            methods[name] = ({"assistant_model": drafter}, drafter)
    return methods


def geomean(values):
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def jsonable(value):
    """``value`` as json writes it (a dataclass as a dict, anything unknown as its str): controller records."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return json.loads(json.dumps(value, default=str)) if value is not None else None


def machine_info(torch, dtype):
    import transformers

    import hf_spec

    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return {"cpu": hf_spec.cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "dtype": dtype, "git": commit.stdout.strip() or None}


def paired_logs(results, name, reference):
    """Per prompt, the log of ``name``'s speedup over ``reference`` in each round (both ran in that round, back to
    back: a slow spell of the machine lasting seconds hits both sides of a pair more often than it hits both
    best-of times)."""
    return [[math.log(ref / own) for ref, own in zip(r[reference]["seconds_by_round"], r[name]["seconds_by_round"])]
            for r in results]  # fmt: skip


def paired_reading(results, name, reference):
    """(geometric mean over prompts of ``name``'s speedup over ``reference`` paired by round, low, high): the 95%
    interval of the timing noise, from how much each prompt's rounds disagree (None without two rounds). It does not
    count which prompts were written: the targets are about these prompts, and a rerun times the same ones."""
    logs = paired_logs(results, name, reference)
    means = [sum(rounds) / len(rounds) for rounds in logs]
    centre = sum(means) / len(means)
    if min(len(rounds) for rounds in logs) < 2:
        return math.exp(centre), None, None
    noise = sum(statistics.variance(rounds) / len(rounds) for rounds in logs)  # of the sum of the prompt means
    half = 1.96 * math.sqrt(noise) / len(logs)
    return math.exp(centre), math.exp(centre - half), math.exp(centre + half)


def format_reading(reading) -> str:
    """A paired reading as "centre (low-high)" ("–" for none; the centre alone without an interval)."""
    if reading is None:
        return "–"
    return f"{reading[0]:.2f}" + ("" if reading[1] is None else f" ({reading[1]:.2f}-{reading[2]:.2f})")


def summarise(results, methods):
    """Per method: geometric means of speedups over prompts (vs plain, vs prompt lookup, per kind; best of the rounds,
    and paired by round with the 95% interval of the timing noise), min, mean τ."""
    rows = {}
    for name in methods:
        vs_plain = [r[name]["tok_s"] / r["plain"]["tok_s"] for r in results]
        vs_pl = [r[name]["tok_s"] / r["prompt_lookup"]["tok_s"] for r in results] if "prompt_lookup" in methods \
            else None  # fmt: skip
        taus = [r[name]["tau"] for r in results if r[name].get("tau") is not None and not math.isnan(r[name]["tau"])]
        same = [r[name]["identical"] for r in results if r[name].get("identical") is not None]
        rows[name] = {"x_plain": geomean(vs_plain), "x_prompt_lookup": geomean(vs_pl) if vs_pl else None,
                      "min_x_plain": min(vs_plain),
                      "x_plain_by_kind": {k: geomean([s for s, r in zip(vs_plain, results) if r["kind"] == k])
                                          for k in KINDS if any(r["kind"] == k for r in results)},
                      "x_plain_paired": paired_reading(results, name, "plain"),
                      "x_prompt_lookup_paired": paired_reading(results, name, "prompt_lookup") if vs_pl else None,
                      "tau": sum(taus) / len(taus) if taus else None,
                      "identical": f"{sum(same)}/{len(same)}" if same else None}  # fmt: skip
    return rows


def markdown(summary, info, command, date, n_prompts, args):
    def f(x):
        return "–" if x is None else f"{x:.2f}"

    kinds = list(next(iter(summary.values()))["x_plain_by_kind"])
    lines = [f"Fresh-machine benchmark, {date}", "",
             f"Machine: {info['cpu']}, {info['threads']} threads, torch {info['torch']}, transformers "
             f"{info['transformers']}, dtype {info['dtype']}, git {info['git']}; cache {info['cache']}", "",
             f"Command: `{command}`", "",
             f"{n_prompts} prompts, {args.max_new_tokens} new tokens, greedy, best of {args.repeats}, methods "
             "interleaved; geometric means over prompts of the speedup in tokens/s. Paired: each round's times "
             "compared within the round, with the 95% interval of the timing noise (from the rounds' spread).", "",
             "| method | x plain | x prompt lookup | x plain, paired | x prompt lookup, paired | "
             + " | ".join(f"x plain: {k}" for k in kinds) + " | slowest prompt, x plain | τ | identical to plain |",
             "|---|" + "---:|" * (len(kinds) + 7)]  # fmt: skip
    for name, s in summary.items():
        lines.append(f"| {name} | {f(s['x_plain'])} | {f(s['x_prompt_lookup'])} | "
                     f"{format_reading(s['x_plain_paired'])} | {format_reading(s['x_prompt_lookup_paired'])} | "
                     + " | ".join(f(s["x_plain_by_kind"].get(k)) for k in kinds)
                     + f" | {f(s['min_x_plain'])} | {f(s['tau'])} | {s['identical'] or '–'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main():
    args = parse_args()
    cache = cold_cache(args.keep_cache)  # before hf_spec is imported
    import hf_spec
    import torch

    dtype = hf_spec.dtype_name(hf_spec.resolve_dtype(args.dtype))  # what `hf-spec demo --dtype auto` picks
    stamp = datetime.now(timezone.utc)
    out = Path(args.out or REPO / "benchmarks" / "fresh_machine" / "results" / f"{dtype}_{stamp:%Y%m%dT%H%M%SZ}")
    command = " ".join(["python", *sys.argv])
    info = {**machine_info(torch, dtype), "cache": cache}
    print(f"[fresh_machine] {info}", flush=True)

    model, tokenizer = hf_spec.load_packaged_model(TARGET, dtype=getattr(torch, dtype))
    wanted = None if args.methods is None else set(args.methods.split(","))
    methods = build_methods(hf_spec, model, wanted)
    names = list(methods)
    print(f"[fresh_machine] methods: {names}", flush=True)
    prompts = PROMPTS[: args.prompts] if args.prompts else PROMPTS

    def encode(text):
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             return_tensors="pt", return_dict=True)  # fmt: skip

    def run(name, enc, max_new_tokens):
        kwargs, drafter = methods[name]
        start = time.perf_counter()
        kernels = contextlib.ExitStack()
        if name == "plain_few_row":
            kernels.enter_context(hf_spec.few_row_linears(model))
            kernels.enter_context(hf_spec.few_query_attention())
        with torch.inference_mode(), kernels:
            output = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
        seconds = time.perf_counter() - start
        return output, seconds, getattr(drafter, "last_generation_stats", None) if drafter is not None else None

    warmup = {}
    enc = encode(WARMUP_PROMPT)
    for name in names:  # untimed, on a prompt outside the set: loading, first-call timings, controller start
        warmup[name] = round(run(name, enc, args.max_new_tokens)[1], 3)
        print(f"[fresh_machine] warm-up {name}: {warmup[name]:.2f} s", flush=True)

    results, turn = [], 0
    for index, (kind, prompt) in enumerate(prompts):
        enc = encode(prompt)
        n_in = enc["input_ids"].shape[1]
        best, rounds = {}, {name: [] for name in names}
        for repeat in range(args.repeats):
            order = names[turn % len(names):] + names[: turn % len(names)]  # rotate who goes first
            turn += 1
            for name in order:
                output, seconds, stats = run(name, enc, args.max_new_tokens)
                rounds[name].append(round(seconds, 4))
                if name not in best or seconds < best[name][1]:
                    best[name] = (output, seconds, stats)
        row = {"index": index, "kind": kind, "prompt": prompt, "prompt_tokens": n_in}
        reference = best["plain"][0]
        for name in names:
            output, seconds, stats = best[name]
            tokens = output.shape[1] - n_in
            entry = {"tokens": tokens, "seconds": round(seconds, 4), "tok_s": tokens / seconds,
                     "seconds_by_round": rounds[name]}  # every round's time (same order of turns as plain's)
            if name != "plain":
                entry["identical"] = bool(torch.equal(output, reference))
            if stats is not None:
                entry["tau"] = None if math.isnan(stats.tau) else stats.tau
                entry["seconds_split"] = {"target": round(stats.target_forward_seconds, 4), "cycles": stats.cycles,
                                          "drafter": round(stats.drafter_forward_seconds, 4),
                                          "loop": round(stats.total_seconds, 4)}  # where the best round's time went
                for attr in ("controller", "shape_choice", "verify_ms"):
                    entry[attr] = jsonable(getattr(stats, attr, None))
            if name == "plain" or entry.get("identical") is False:
                entry["text"] = tokenizer.decode(output[0, n_in:], skip_special_tokens=True)
            row[name] = entry
        results.append(row)
        cells = ", ".join(f"{n} {row[n]['tok_s'] / row['plain']['tok_s']:.2f}x"
                          + (f" τ{row[n]['tau']:.2f}" if row[n].get("tau") is not None else "")
                          + ("" if row[n].get("identical", True) else " DIFFERS") for n in names)  # fmt: skip
        print(f"[{index + 1}/{len(prompts)} {kind}] plain {row['plain']['tok_s']:.1f} tok/s; {cells}", flush=True)

    summary = summarise(results, names)
    table = markdown(summary, info, command, f"{stamp:%Y-%m-%d %H:%M} UTC", len(prompts), args)
    print("\n" + table, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(table)
    if not args.keep_cache:  # what hf-spec wrote into the cold cache during the run
        root = os.environ["HF_SPEC_CACHE"]
        info["cache_written"] = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root)
                                       for f in files)  # os.walk does not follow the models/ link
    info["kernel_choices"] = {"linear": hf_spec.kernel_choices(), "attention": hf_spec.attention_choices()}
    record = {"command": command, "date": stamp.isoformat(), "machine": info, "target": TARGET,
              "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "methods": names,
              "warmup_seconds": warmup, "summary": summary, "prompts": results}  # fmt: skip
    (out / "results.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"[fresh_machine] wrote {out}/results.json and summary.md", flush=True)


if __name__ == "__main__":
    main()
