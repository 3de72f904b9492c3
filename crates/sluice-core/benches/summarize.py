#!/usr/bin/env python3
"""Summarizes several saved criterion runs of the `decisions` bench.

    python3 crates/sluice-core/benches/summarize.py run1 run2 run3

Each argument names a baseline saved with `cargo bench ... -- --save-baseline NAME`. For every
benchmark it prints the median over the runs of criterion's median time per decision, the
spread (lowest and highest run), and, where governor was measured on the same keys and threads,
the median over the runs of the ratio Sluice/governor, each ratio taken within one run.
"""

import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CRITERION = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "criterion"


def baseline_of(bench_id):
    """The governor benchmark measured on the same keys and threads, if any."""
    name, rest = bench_id.split("/", 1)
    if name.startswith("governor"):
        return None
    if name.endswith("_denied"):
        return f"governor_denied/{rest}"
    return f"governor/{rest}"


def load(runs):
    """{bench id: {run: median ns}}"""
    times = {}
    for bench in CRITERION.iterdir():
        for run in runs:
            est = bench / run / "estimates.json"
            meta = bench / run / "benchmark.json"
            if not est.exists() or not meta.exists():
                continue
            bench_id = json.loads(meta.read_text())["full_id"]
            median = json.loads(est.read_text())["median"]["point_estimate"]
            times.setdefault(bench_id, {})[run] = median
    return times


def fmt(ns):
    return f"{ns / 1000:.2f} µs" if ns >= 1000 else f"{ns:.0f} ns"


def main(runs):
    if not runs:
        sys.exit(__doc__)
    times = load(runs)
    print(f"{'benchmark':34} {'median':>10} {'range':>21} {'vs governor':>12}")
    for bench_id in sorted(times):
        per_run = times[bench_id]
        med = statistics.median(per_run.values())
        spread = f"{fmt(min(per_run.values()))}-{fmt(max(per_run.values()))}"
        ratio = ""
        base = baseline_of(bench_id)
        if base in times:
            ratios = [per_run[r] / times[base][r] for r in per_run if r in times[base]]
            if ratios:
                ratio = f"{statistics.median(ratios):.2f}x"
        missing = "" if len(per_run) == len(runs) else f"  ({len(per_run)} of {len(runs)} runs)"
        print(f"{bench_id:34} {fmt(med):>10} {spread:>21} {ratio:>12}{missing}")


if __name__ == "__main__":
    main(sys.argv[1:])
