"""The sharded plan as data (the JSON object of ``mtpp shard``) and as files in ``--out DIR``:
``strategies.yaml`` (loads back with ``--config``), ``plan.json`` and ``annotated.onnx``."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from solver.core.files import json_safe
from solver.core.outdir import replace_dir, temp_dir_beside
from solver.spmd.config import annotate, dump_yaml
from solver.spmd.model import ShardModel
from solver.spmd.program import Planner, Program, fmt_strategy


def plan_dict(planner: Planner, program: Program, method: str, status: str) -> dict:
    """Every field the issue lists: mesh, strategies, layouts, redistributions, totals."""
    sm = planner.sm
    ops = []
    for v, op in enumerate(sm.ops):
        sh = program.shardings[v]
        ops.append(
            {
                "name": op.name,
                "op_type": op.op_type,
                "strategy": [list(s) for s in sh.strategy],
                "device_matrix": list(sh.device_matrix),
                "local_shape": [list(lay.local_shape) for lay in sh.out_layouts],
                "local_flops": sh.local_flops,
                "compute": program.compute[v],
                "communication": program.comm[v],
            }
        )
    redists = []
    for (v, k), r in sorted(program.redists.items()):
        if r.steps:
            t = sm.ops[v].data_inputs[k]
            redists.append({"tensor": t, "consumer": sm.ops[v].name, "input": k, **r.to_dict()})
    for t, r in program.output_redists.items():
        if r.steps:
            redists.append({"tensor": t, "consumer": None, "input": None, **r.to_dict()})
    return {
        "format": "mtpp-shard-plan",
        "model": sm.model.graph.name,
        "mesh": planner.mesh.to_dict(),
        "method": method,
        "status": status,
        "objective": program.objective,
        "compute_time": math.fsum(program.compute),
        "communication_time": math.fsum(program.comm) + program.output_comm,
        "strategies": {
            op.name: [list(s) for s in program.shardings[v].strategy] for v, op in enumerate(sm.ops)
        },
        "layouts": {t: lay.to_dict() for t, lay in program.layouts.items()},
        "output_layouts": {t: lay.to_dict() for t, lay in program.output_layouts.items()},
        "redistributions": redists,
        "collectives": program.collectives(),
        "comm_bytes_per_device": program.comm_bytes_per_device,
        "weight_memory_per_device": program.weight_memory,
        "peak_activation_memory_per_device": program.peak_activation_memory,
        "max_memory_per_device": program.memory_per_device,
        "operators": ops,
        "replicated_op_types": planner.replicated_ops,
    }


def write_out(out_dir: str | Path, sm: ShardModel, strategies: dict, plan: dict) -> None:
    """Write the three files into a temporary folder beside ``out_dir``, then rename it into
    place (:func:`solver.core.outdir.replace_dir`; check ``out_dir`` first with
    :func:`solver.core.files.check_output_dir`)."""
    import onnx

    out_dir = Path(out_dir)
    tmp = temp_dir_beside(out_dir)
    try:
        (tmp / "strategies.yaml").write_text(dump_yaml(strategies))
        # as on stdout (print_json): numpy values plain, NaN and infinities as null
        text = json.dumps(json_safe(plan), indent=1, allow_nan=False)
        (tmp / "plan.json").write_text(text + "\n")
        model = onnx.ModelProto.FromString(sm.source.SerializeToString())
        annotate(model, strategies, {op.name: op.node_index for op in sm.ops})
        big = model.ByteSize() > 1_500_000_000
        onnx.save_model(
            model,
            str(tmp / "annotated.onnx"),
            save_as_external_data=big,
            location="annotated.onnx.data",
        )
        replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def human_table(planner: Planner, program: Program, plan: dict):
    """A rich table: one row per operator, then the totals."""
    from rich.table import Table

    from solver.cli.common import esc
    from solver.core.units import format_bytes, format_time

    t = Table(title=f"mtpp shard: {esc(plan['model'])} on mesh {plan['mesh']['shape']}")
    for col in ("node", "op", "strategy", "local out shape", "compute", "communication"):
        t.add_column(
            col,
            justify="right" if col in ("compute", "communication") else "left",
            no_wrap=col == "strategy",  # a strategy is read whole (and searched for by tests)
        )
    for row, sh in zip(plan["operators"], program.shardings, strict=True):
        t.add_row(
            esc(row["name"]),
            row["op_type"],
            fmt_strategy(sh.strategy),
            " ".join("x".join(map(str, s)) or "()" for s in row["local_shape"]),
            format_time(row["compute"]),
            format_time(row["communication"]) if row["communication"] else "-",
        )
    totals = [
        f"status {plan['status']}, objective {format_time(plan['objective'])} "
        f"(compute {format_time(plan['compute_time'])}, "
        f"communication {format_time(plan['communication_time'])})",
        "collectives: "
        + (", ".join(f"{k} x{v}" for k, v in plan["collectives"].items()) or "none")
        + f", {format_bytes(plan['comm_bytes_per_device'])} sent per device",
        f"memory per device: {format_bytes(plan['max_memory_per_device'])} "
        f"(weights {format_bytes(plan['weight_memory_per_device'])}, activation peak "
        f"{format_bytes(plan['peak_activation_memory_per_device'])})",
    ]
    return t, totals
