"""The sharded plan as data: the JSON object of ``mtpp shard`` (its files in ``--out DIR`` are
written by solver/backends/export_spmd.py, its table printed by solver/cli/shard.py)."""

from __future__ import annotations

import math

from solver.spmd.program import Planner, Program


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
