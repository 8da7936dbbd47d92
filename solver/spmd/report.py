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
    out = {
        "format": "mtpp-shard-plan",
        "model": sm.model.graph.name,
        "mesh": planner.mesh.to_dict(),
        "method": method,
        "status": status,
        "objective": program.objective,
        "compute_time": math.fsum(program.compute) + _backward(program, "backward_compute"),
        "communication_time": math.fsum(program.comm)
        + program.output_comm
        + _backward(program, "backward_comm")
        + _backward(program, "sync_time")
        + (program.training.output_backward if program.training is not None else 0.0),
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
    if program.training is not None:
        out["training"] = training_dict(planner, program)
        for row, tr in zip(ops, _per_op(program), strict=True):
            row.update(tr)
    return out


def _backward(program: Program, field: str) -> float:
    """A training term summed over the operators (0 for inference)."""
    return math.fsum(getattr(program.training, field)) if program.training is not None else 0.0


def _per_op(program: Program) -> list[dict]:
    tr = program.training
    return [
        {"backward_compute": c, "backward_communication": b, "gradient_sync": s}
        for c, b, s in zip(tr.backward_compute, tr.backward_comm, tr.sync_time, strict=True)
    ]


def training_dict(planner: Planner, program: Program) -> dict:
    """The training terms of a plan: the forward and backward times, the gradient
    synchronisation of every weight (AllReduce or ZeRO-1) and the state factor."""
    tr = program.training
    sm = planner.sm
    syncs = [
        {
            "weight": s.tensor,
            "operator": sm.ops[v].name,
            "group": s.group,
            "mode": "zero1" if s.tensor in tr.zero1 else "allreduce",
            "time": s.time,
            "bytes_per_device": s.bytes_per_device,
        }
        for (v, _k), s in sorted(tr.sync.items())
    ]
    forward = math.fsum(program.compute) + math.fsum(program.comm) + program.output_comm
    return {
        "optimizer_state": planner.training.optimizer_state,
        "forward_time": forward,
        "backward_compute_time": math.fsum(tr.backward_compute),
        "backward_communication_time": math.fsum(tr.backward_comm) + tr.output_backward,
        "gradient_sync_time": math.fsum(tr.sync_time),
        "trainable_weights": len(planner.flow.trainable),
        "gradient_sync": syncs,
    }
