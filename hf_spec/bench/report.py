"""Write benchmark results: ``results.json``, ``results.md`` (table) and ``results.png`` (plot)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["markdown_table", "plot", "write_report"]


def _fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def markdown_table(summary: dict[str, dict[str, dict]]) -> str:
    """One row per data set and method: tokens/s, speedup, τ, draft/verify ms per cycle, identical outputs."""
    lines = [
        "| data set | method | prompts | new tokens | tokens/s | speedup | wall speedup | median per-prompt speedup | τ "
        "| verified tokens/cycle | draft ms/cycle | verify ms/cycle | identical to plain |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for dataset, methods in summary.items():
        for method, s in methods.items():
            lines.append(
                f"| {dataset} | {method} | {s['prompts']} | {s['new_tokens']} | {_fmt(s['tokens_per_s'], '.1f')} "
                f"| {_fmt(s['speedup'], '.2f')}× | {_fmt(s['wall_speedup'], '.2f')}× | {_fmt(s['median_speedup'], '.2f')}× "
                f"| {_fmt(s['tau'], '.2f')} | {_fmt(s.get('verified_per_cycle'), '.1f')} "
                f"| {_fmt(s.get('draft_ms_per_cycle'), '.1f')} | {_fmt(s.get('verify_ms_per_cycle'), '.1f')} "
                f"| {s['identical']}/{s['prompts']} |"
            )
    accept = [
        (d, m, s["acceptance_by_position"])
        for d, ms in summary.items()
        for m, s in ms.items()
        if s.get("acceptance_by_position")
    ]
    if accept:
        lines += ["", "Acceptance rate by draft position:", ""]
        depth = max(len(a) for *_, a in accept)
        lines.append("| data set | method | " + " | ".join(str(i + 1) for i in range(depth)) + " |")
        lines.append("|---|---|" + "---:|" * depth)
        for d, m, a in accept:
            cells = [_fmt(a[i] if i < len(a) else None, ".2f") for i in range(depth)]
            lines.append(f"| {d} | {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, dict[str, dict]], path: Path, title: str = "") -> None:
    """Bar charts of speedup and τ per method per data set, plus acceptance by position."""
    try:
        import matplotlib
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("The plot needs matplotlib: pip install 'hf-spec[bench]'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(summary)
    methods = list(next(iter(summary.values())))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    width = 0.8 / max(1, len(methods))
    for ax, key, label in ((axes[0], "speedup", "speedup over plain greedy (tokens/s)"), (axes[1], "tau", "τ (tokens per target forward)")):
        for j, m in enumerate(methods):
            values = [summary[d][m][key] or 0.0 for d in datasets]
            xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(datasets))]
            ax.bar(xs, values, width, label=m)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xticks(range(len(datasets)), datasets)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    ax = axes[2]
    curves = [(d, m, s["acceptance_by_position"]) for d, ms in summary.items() for m, s in ms.items() if s.get("acceptance_by_position")]
    for d, m, a in curves:
        ax.plot(range(1, len(a) + 1), a, marker="o", label=f"{m} / {d}")
    if curves:
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no method here exposes\nacceptance by position", ha="center", va="center")
        ax.set_axis_off()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(output_dir: str | Path, metadata: dict[str, Any], summary: dict, rows: list[dict]) -> dict[str, Path]:
    """Write the JSON (metadata + summary + per-prompt rows), markdown and PNG files."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "results.md", "plot": out / "results.png"}
    with open(paths["json"], "w") as f:
        json.dump({**metadata, "summary": summary, "samples": rows}, f, indent=2, ensure_ascii=False)
        f.write("\n")
    settings = metadata.get("settings", {})
    machine = metadata.get("machine", {})
    header = (
        f"# Benchmark: {settings.get('target', '?')}\n\n"
        f"- command: `{metadata.get('command', '')}`\n"
        f"- date: {metadata.get('date', '')}\n"
        f"- machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores; torch {machine.get('torch', '?')}, "
        f"transformers {machine.get('transformers', '?')}; dtype {machine.get('dtype', '?')}\n"
        f"- greedy, max_new_tokens={settings.get('max_new_tokens')}, methods interleaved per prompt\n\n"
    )
    paths["markdown"].write_text(header + markdown_table(summary))
    plot(summary, paths["plot"], title=f"{settings.get('target', '')} ({machine.get('dtype', '')})")
    return paths
