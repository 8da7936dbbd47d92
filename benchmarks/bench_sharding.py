"""Operator-level sharding (issues 12 and 13's acceptance numbers).

    python benchmarks/bench_sharding.py          # every row; --only propagate|verify|exact

1. Sharding propagation on a 24-layer BERT-large-shaped encoder (hidden 1024, 16 heads, FFN 4096,
   batch 8, sequence 128, vocabulary 30528: 30522 padded to a multiple of 64 as Megatron does,
   so that 8 devices divide it) on 8 devices. Weights are shapes only (no bytes). Megatron-style
   strategies are configured on the attention and FFN MatMuls and the embedding (target <= 2 s);
   a second row configures one MatMul only.
2. ``--verify`` of a 4-layer transformer (hidden 256, 8 heads, batch 8, sequence 64, random
   weights) on 8 emulated devices with the same configuration (target <= 30 s).
3. The exact optimiser (``--method cpsat``) under a memory limit that forbids replicating the
   weights: the BERT-large-shaped encoder on 8 devices (1 GB, 400 MB, 256 MiB, the least memory
   any plan needs (166 MiB), 168 MiB and 180 MiB per device;
   the replicated weights take 1.33 GB, sharded 8 ways 167 MB; target OPTIMAL or gap <= 1% in
   <= 60 s) and a 48-layer
   GPT-2-XL-shaped decoder (hidden 1600, 25 heads, FFN 6400, vocabulary 50304, batch 4,
   sequence 256; weights never materialised) on 16 devices, mesh 4x4, 4 GB per device (the
   replicated weights take 6.5 GB; target gap <= 1% in <= 120 s); propagation (unconfigured),
   data parallel and Megatron as ratios to the certified plan and to the bound.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from pathlib import Path

from solver.backends.verify import verify
from solver.core.cluster import load_cluster
from solver.spmd.mesh import Mesh
from solver.spmd.model import from_proto
from solver.spmd.program import Planner, evaluate
from solver.spmd.propagate import propagate

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "sharding_examples", ROOT / "models" / "sharding_examples.py"
)
examples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(examples)


def megatron(layers: int, devices: int) -> dict:
    """Column-split Q/K/V and FFN1, row-split O and FFN2, vocabulary-split embedding."""
    conf = {"embed": ((devices, 1), (1, 1))}
    for i in range(layers):
        p = f"l{i}."
        for t in ("q", "k", "v", "ffn1"):
            conf[p + t + ".matmul"] = ((1, 1, 1), (1, devices))
        for t in ("o", "ffn2"):
            conf[p + t + ".matmul"] = ((1, 1, devices), (devices, 1))
    return conf


def run(model, conf: dict, devices: int, check: bool) -> dict:
    cluster = load_cluster(None, devices)
    mesh = Mesh((devices,), (cluster.link_bandwidth,), (cluster.link_latency,))
    t0 = time.perf_counter()
    sm = from_proto(model, {})
    t1 = time.perf_counter()
    planner = Planner(sm, mesh, cluster)
    strategies = propagate(planner, conf)
    t2 = time.perf_counter()
    program = evaluate(planner, strategies)
    t3 = time.perf_counter()
    row = {
        "ops": len(sm.ops),
        "load_s": t1 - t0,
        "propagate_s": t2 - t1,
        "evaluate_s": t3 - t2,
        "objective_s": program.objective,
        "comm_MB_per_device": program.comm_bytes_per_device / 1e6,
        "collectives": program.collectives(),
        "memory_MB_per_device": program.memory_per_device / 1e6,
    }
    if check:
        v = verify(planner, program, seed=0)
        row["verify_s"] = time.perf_counter() - t3
        row["verify_ok"] = v["ok"]
        row["max_abs_diff"] = v["max_abs_diff"]
    return row


def exact_rows(name: str, model, devices: int, mesh, limit: str, time_limit: float) -> None:
    """cpsat, then the heuristics as ratios to its plan and to its bound."""
    from solver.core.errors import MtppError
    from solver.core.units import parse_quantity
    from solver.spmd.solve import solve_sharding

    sm = from_proto(model, {})
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    ex = solve_sharding(sm, devices, mesh, "cpsat", limit, time_limit=time_limit)
    wall = time.perf_counter() - t0
    st = ex.stats
    print(
        f"{name}: {len(sm.ops)} ops, {devices} devices, mesh {mesh or devices}, --memory {limit}"
        f" (load {load:.1f}): cpsat {ex.status} objective {ex.objective * 1e3:.4f} ms, bound "
        f"{ex.lower_bound * 1e3:.4f} ms ({st.get('binding_bound', 'cpsat')}), gap "
        f"{100 * ex.gap:.2f}%, {wall:.1f} s (bounds {st.get('lagrange_seconds', 0):.1f} s, of "
        f"which weight budget {st.get('budget_seconds', 0):.1f} s; CP-SAT "
        f"{st.get('cpsat_status', '-')} {st.get('solve_seconds', 0):.1f} s), memory "
        f"{ex.program.memory_per_device / 1e6:.1f} MB, collectives {ex.program.collectives()}",
        flush=True,
    )
    cap = parse_quantity(limit, "bytes")
    for method in ("propagate", "dp", "megatron"):
        try:
            h = solve_sharding(sm, devices, mesh, method, None)
        except MtppError as e:
            print(f"  {method}: {e}")
            continue
        fits = h.program.memory_per_device <= cap
        print(
            f"  {method}: {h.objective * 1e3:.4f} ms = {h.objective / ex.objective:.3f} x cpsat "
            f"(<= {h.objective / ex.lower_bound:.3f} x optimum), memory "
            f"{h.program.memory_per_device / 1e6:.1f} MB"
            + ("" if fits else f" > {limit}: does not fit"),
            flush=True,
        )


def least_memory_bytes(model, devices: int) -> int:
    """The least memory per device any plan needs (proven: the limit of the tightest row)."""
    from solver.spmd.lagrange import least_memory_plan

    cluster = load_cluster(None, devices)
    mesh = Mesh((devices,), (cluster.link_bandwidth,), (cluster.link_latency,))
    lean = least_memory_plan(Planner(from_proto(model, {}), mesh, cluster), {}, 120.0)
    if lean is None or not lean.exact:
        raise SystemExit("the least memory was not proven in 120 s")
    print(f"least memory any plan needs: {int(lean.upper)} bytes", flush=True)
    return int(lean.upper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", choices=["propagate", "verify", "exact"])
    ap.add_argument("--devices", type=int, default=8)
    a = ap.parse_args()
    n = a.devices
    if a.only in (None, "propagate"):
        bert = examples.transformer(
            layers=24, batch=8, seq=128, hidden=1024, heads=16, vocab=30528, weights=False
        )
        for name, conf in (
            ("megatron config", megatron(24, n)),
            ("one MatMul configured", {"l0.ffn1.matmul": ((2, 1, 1), (1, n // 2))}),
        ):
            row = run(bert, conf, n, check=False)
            print(f"BERT-large 24 layers, {n} devices, {name}: {row}")
    if a.only in (None, "verify"):
        model = examples.transformer(layers=4, batch=8, seq=64, hidden=256, heads=8, vocab=1000)
        row = run(model, megatron(4, n), n, check=True)
        print(f"transformer 4 layers, {n} devices, --verify: {row}")
    if a.only in (None, "exact"):
        bert = examples.transformer(
            layers=24, batch=8, seq=128, hidden=1024, heads=16, vocab=30528, weights=False
        )
        least = least_memory_bytes(bert, 8)
        for limit in ("1GB", "400MB", "256MiB", str(least), "168MiB", "180MiB"):
            exact_rows("BERT-large 24 layers", bert, 8, None, limit, 60.0)
        gpt = examples.transformer(
            layers=48, batch=4, seq=256, hidden=1600, heads=25, ffn_size=6400, vocab=50304,
            weights=False, decoder=True,
        )  # fmt: skip
        exact_rows("GPT-2-XL-shaped 48 layers", gpt, 16, "4x4", "4GB", 120.0)


if __name__ == "__main__":
    main()
