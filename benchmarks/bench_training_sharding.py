"""Training-aware operator sharding (``mtpp shard --training``) on a GPT-2-XL-shaped decoder.

    python benchmarks/bench_training_sharding.py                 # every limit
    python benchmarks/bench_training_sharding.py --memory 16GB   # one limit ('none': no limit)

48 layers, hidden 1600, 25 heads, FFN 6400, vocabulary 50304, batch 4, sequence 256, weights
never materialised, on 8 devices of the default cluster; ``--method cpsat`` with a 120 s time
limit (target: OPTIMAL or gap <= 1% within it), fp32 Adam (optimizer state factor 4), and the
heuristics as ratios to the certified plan. The machine's load average is printed with each
row: the exact search shares the cores.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from collections import Counter
from pathlib import Path

from solver.core.errors import MtppError
from solver.spmd.model import from_proto
from solver.spmd.solve import solve_sharding
from solver.spmd.training import TrainingSpec

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "sharding_examples", ROOT / "models" / "sharding_examples.py"
)
examples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(examples)

LIMITS = ("none", "24GB", "16GB")


def row(sm, limit: str | None, devices: int, time_limit: float) -> None:
    """cpsat with its bound and time, then the heuristics against it."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    spec = TrainingSpec()
    ex = solve_sharding(sm, devices, None, "cpsat", limit, time_limit=time_limit, training=spec)
    wall = time.perf_counter() - t0
    st = ex.stats
    tr = ex.program.training
    splits = Counter(str(s) for s in ex.strategies.values()).most_common(3)
    print(
        f"--memory {limit or 'none'} (load {load:.1f}): {ex.status} {ex.objective * 1e3:.4f} ms, "
        f"bound {ex.lower_bound * 1e3:.4f} ms ({st.get('binding_bound', 'cpsat')}), gap "
        f"{100 * ex.gap:.2f}%, {wall:.1f} s; memory {ex.program.memory_per_device / 1e9:.2f} GB,"
        f" ZeRO-1 on {len(tr.zero1)} weights; commonest strategies {splits}",
        flush=True,
    )
    for method in ("dp", "megatron", "propagate"):
        try:
            h = solve_sharding(sm, devices, None, method, limit, training=spec)
        except MtppError as e:
            print(f"  {method}: {e}", flush=True)
            continue
        print(
            f"  {method}: {h.objective * 1e3:.4f} ms = {h.objective / ex.objective:.3f} x cpsat, "
            f"memory {h.program.memory_per_device / 1e9:.2f} GB",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--memory", action="append", help="limit per device ('none': no limit)")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=120.0)
    a = ap.parse_args()
    gpt = examples.transformer(
        layers=48, batch=4, seq=256, hidden=1600, heads=25, ffn_size=6400, vocab=50304,
        weights=False, decoder=True,
    )  # fmt: skip
    sm = from_proto(gpt, {})
    print(f"GPT-2-XL-shaped decoder: {len(sm.ops)} operators, {a.devices} devices", flush=True)
    for limit in a.memory or LIMITS:
        row(sm, None if limit == "none" else limit, a.devices, a.time_limit)


if __name__ == "__main__":
    main()
