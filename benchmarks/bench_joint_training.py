"""A joint training plan (data x tensor x pipeline) of the Llama-2-7B shape on dgx-a100-x2 with
its certificate (docs/training.md, "Joint training plans").

    python benchmarks/bench_joint_training.py [--memory 80GB,40GB] [--time-limit 600]
        [--microbatches 32] [--seq 4096] [--optimizer-state 8] [--cut-stride 2]
        [--space joint|pipeline|sharding] [--json OUT]

Builds the Llama-2-7B shape in memory (models/llama.py; the weights are never written nor
read: the sharding planner needs their shapes only) at ``--seq`` tokens per microbatch and, for
each capacity, runs ``solver.joint.plan_joint_training`` with 1F1B, m microbatches and the
state factor (8: mixed-precision Adam). ``--cut-stride 2`` keeps every second position where
the fewest tensors cross, the layer boundaries: the stated space (``bound_space``) says so.
Prints one Markdown row per capacity (status, T, the bound over the space with the name of the
one that binds: the stage-sum training bound, the lower programme or the universal training
bound, the gap, the stages as layers x sub-mesh, wall seconds) and the load average; ``--json``
writes every plan (``stats["bounds"]``: the three bounds' values).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from solver.core.cluster import load_cluster  # noqa: E402
from solver.core.training import TrainingSpec  # noqa: E402
from solver.joint.training import plan_joint_training  # noqa: E402
from solver.spmd.model import from_proto  # noqa: E402


@dataclass(frozen=True)
class Row:
    """One capacity's outcome."""

    memory: str
    plan: object | None
    error: str | None
    wall: float


def llama_model(seq: int):
    """The Llama-2-7B shape (models/llama.py) as a ShardModel, weights unloaded."""
    spec = importlib.util.spec_from_file_location("llama_shapes", ROOT / "models" / "llama.py")
    llama = importlib.util.module_from_spec(spec)
    sys.modules["llama_shapes"] = llama
    spec.loader.exec_module(llama)
    model, _ = llama.llama(llama.LlamaShape(**llama.PRESETS["7b"], seq=seq), "absent.data")
    return from_proto(model, {})


def layers_of(stage) -> str:
    """The layer numbers a stage's operators name (``/model/layers.N/``)."""
    nums = sorted(
        {int(op.split("layers.")[1].split("/")[0]) for op in stage.ops if "layers." in op}
    )
    if not nums:
        return "-"
    return f"{nums[0]}-{nums[-1]}" if len(nums) > 1 else str(nums[0])


def describe(plan) -> str:
    return "; ".join(
        f"layers {layers_of(s)} on {len(s.devices)} GPUs (mesh {'x'.join(map(str, s.mesh.shape))})"
        for s in plan.stages
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--memory", default="80GB,40GB")
    ap.add_argument("--time-limit", type=float, default=600.0)
    ap.add_argument("--microbatches", type=int, default=32)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--optimizer-state", type=float, default=8.0)
    ap.add_argument("--cut-stride", type=int, default=2)
    ap.add_argument("--cluster", default="dgx-a100-x2")
    ap.add_argument("--space", default="joint", choices=("joint", "pipeline", "sharding"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    sm = llama_model(args.seq)
    cluster = load_cluster(args.cluster)
    spec = TrainingSpec("1f1b", args.microbatches, optimizer_state=args.optimizer_state)
    rows = []
    for memory in args.memory.split(","):
        t0 = time.perf_counter()
        try:
            plan = plan_joint_training(
                sm,
                cluster,
                spec,
                memory=memory,
                time_limit=args.time_limit,
                cut_stride=args.cut_stride,
                space=args.space,
            )
            rows.append(Row(memory, plan, None, time.perf_counter() - t0))
        except Exception as e:  # noqa: BLE001 - a benchmark row records the failure
            rows.append(Row(memory, None, str(e), time.perf_counter() - t0))
        print_row(rows[-1])
    print(f"load average {os.getloadavg()[0]:.1f} (1 min) at the end", flush=True)
    if args.json:
        out = [r.plan.to_dict() if r.plan is not None else {"error": r.error} for r in rows]
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def print_row(r: Row) -> None:
    if r.plan is None:
        print(f"| {r.memory} | error: {r.error} | {r.wall:.0f} s |", flush=True)
        return
    p = r.plan
    gap = "-" if p.gap is None else f"{100 * p.gap:.2f}%"
    print(
        f"| {r.memory} | {p.status} | {p.objective:.4f} s | {p.lower_bound:.4f} s "
        f"({p.stats.get('bound', '-')}) | {gap} | "
        f"{describe(p)} | {r.wall:.0f} s |",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
