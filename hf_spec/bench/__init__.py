"""Benchmarks: packaged data-set loaders, the speed/τ harness and its reports."""

from .datasets import BENCH_DATASETS, load_chitchat, load_gsm8k, load_humaneval, load_mt_bench, load_sharegpt
from .harness import BenchSettings, Method, build_prompts, parse_method, run_benchmark, summarize
from .report import write_report

__all__ = [
    "BENCH_DATASETS",
    "BenchSettings",
    "Method",
    "build_prompts",
    "load_chitchat",
    "load_gsm8k",
    "load_humaneval",
    "load_mt_bench",
    "load_sharegpt",
    "parse_method",
    "run_benchmark",
    "summarize",
    "write_report",
]
