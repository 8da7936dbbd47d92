"""The obvious sharding plans practitioners write by hand, as methods and as warm starts.

- ``dp`` (data parallel): every operator splits the leading dim of its first output over all
  devices when it can (the batch), else runs replicated; weights are replicated.
- ``megatron`` (Megatron-LM's tensor parallelism): MatMul / Gemm layers with a weight alternate
  column splits (the output features) and row splits (the contraction, whose partial sums are
  reduced); an embedding Gather splits its vocabulary; sharding propagation fills in the rest.

Operators the user configured (pins) keep their strategies in both.
"""

from __future__ import annotations

import contextlib
from collections import deque

from solver.spmd.program import Planner
from solver.spmd.propagate import propagate
from solver.spmd.rules import Strategy, StrategyError, data_parallel, strategy_of


def data_parallel_plan(planner: Planner, pins: dict[str, Strategy]) -> dict[str, Strategy]:
    """Batch split over all devices wherever the operator allows it, else replicated."""
    out = {}
    for op in planner.sm.ops:
        if op.name in pins:
            out[op.name] = pins[op.name]
            continue
        spec = planner.specs[op.index]
        dp = data_parallel(spec, planner.devices)
        strategy = strategy_of(spec, (1,) * len(spec.loops))
        if dp is not None:
            with contextlib.suppress(StrategyError):  # an output dim it does not divide
                strategy = planner.sharding(op.index, strategy_of(spec, dp)).strategy
        out[op.name] = strategy
    return out


def _weight_matmul(planner: Planner, i: int) -> tuple[int, int] | None:
    """(column loop, row loop) of a MatMul / Gemm whose second input is a weight, else None."""
    op, spec = planner.sm.ops[i], planner.specs[i]
    if op.op_type not in ("MatMul", "Gemm") or spec.kind == "replicated":
        return None
    if len(op.data_inputs) < 2 or op.data_inputs[1] not in planner.sm.consts:
        return None
    if op.data_inputs[0] in planner.sm.consts:
        return None
    n = len(spec.loops)
    return n - 1, n - 2  # MatMul (batch..., i, k, j) and Gemm (i, k, j): j columns, k rows


def _largest_split(size: int, devices: int) -> int:
    return max(d for d in range(1, devices + 1) if devices % d == 0 and size % d == 0)


def megatron_roles(planner: Planner) -> dict[int, str]:
    """'column' or 'row' per weight MatMul: row when a nearest weight-MatMul ancestor (through
    activations) is a column split, else column (Megatron's alternation)."""
    sm = planner.sm
    roles: dict[int, str] = {}
    for v in range(len(sm.ops)):
        if _weight_matmul(planner, v) is None:
            continue
        seen, nearest = set(), set()
        queue = deque(u for u, _, k in planner.in_edges[v] if k == 0)
        while queue:
            u = queue.popleft()
            if u in seen:
                continue
            seen.add(u)
            if u in roles:
                nearest.add(roles[u])
                continue
            queue.extend(w for w, _, _ in planner.in_edges[u])
        roles[v] = "row" if "column" in nearest else "column"
    return roles


def megatron_config(planner: Planner) -> dict[str, Strategy]:
    """The Megatron strategies of the weight MatMuls and embedding Gathers (no propagation)."""
    sm, n = planner.sm, planner.devices
    conf: dict[str, Strategy] = {}
    for v, role in megatron_roles(planner).items():
        col, row = _weight_matmul(planner, v)
        spec = planner.specs[v]
        loop = col if role == "column" else row
        d = _largest_split(spec.loops[loop], n)
        if d == 1:
            continue
        splits = tuple(d if i == loop else 1 for i in range(len(spec.loops)))
        try:
            conf[sm.ops[v].name] = planner.sharding(v, strategy_of(spec, splits)).strategy
        except StrategyError:
            continue
    for op in sm.ops:
        spec = planner.specs[op.index]
        if op.op_type != "Gather" or spec.kind != "gather" or op.data_inputs[0] not in sm.consts:
            continue
        axis = next(iter(spec.partial))
        d = _largest_split(spec.loops[axis], n)
        if d > 1:
            splits = tuple(d if i == axis else 1 for i in range(len(spec.loops)))
            try:
                conf[op.name] = planner.sharding(op.index, strategy_of(spec, splits)).strategy
            except StrategyError:
                continue
    return conf


def megatron_plan(planner: Planner, pins: dict[str, Strategy]) -> dict[str, Strategy]:
    """Megatron column/row splits on the weight MatMuls (pins win), then propagation."""
    conf = {**megatron_config(planner), **pins}
    return propagate(planner, conf)
