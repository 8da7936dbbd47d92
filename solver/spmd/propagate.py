"""Sharding propagation (MindSpore, seed 002): BFS from the configured operators in both
directions; each operator reached takes the candidate strategy with the least redistribution
time over its edges to operators already settled (ties: less compute, then fewer bytes, then the
same device matrix as its settled neighbours, then the first candidate).

Configured operators keep their strategies; two of them that disagree are joined by a
redistribution. A part of the graph no BFS reaches is started from its first operator in
topological order, data parallel when it can be, else replicated, and propagated from there.
"""

from __future__ import annotations

from collections import deque

from solver.spmd.mesh import canonical
from solver.spmd.program import Planner
from solver.spmd.rules import (
    OpSharding,
    Strategy,
    StrategyError,
    data_parallel,
    strategy_of,
)


def _bare(dm: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(x for x in dm if x > 1)


def choose(planner: Planner, v: int, settled: dict[int, OpSharding]) -> OpSharding:
    """The candidate of ``v`` that is cheapest against its settled neighbours."""
    best, best_key = None, None
    for idx, c in enumerate(planner.candidates(v)):
        time = sent = 0.0
        mismatch = 0
        for u, pos, k in planner.in_edges[v]:
            if u in settled:
                src = settled[u].out_layouts[pos]
                r = planner.redistribution(src, c.in_layouts[k], planner.sm.ops[v].data_inputs[k])
                time += r.time
                sent += r.bytes_per_device
                mismatch += _bare(canonical(src).device_matrix) != _bare(c.device_matrix)
        for w, pos, k in planner.out_edges[v]:
            if w in settled:
                dst = settled[w].in_layouts[k]
                r = planner.redistribution(c.out_layouts[pos], dst, planner.sm.ops[v].outputs[pos])
                time += r.time
                sent += r.bytes_per_device
                mismatch += _bare(dst.device_matrix) != _bare(c.device_matrix)
        key = (time, planner.compute_time(v, c), sent, mismatch, idx)
        if best_key is None or key < best_key:
            best, best_key = c, key
    return best


def start(planner: Planner, v: int) -> OpSharding:
    """Data parallel if the operator allows it, else replicated."""
    spec = planner.specs[v]
    dp = data_parallel(spec, planner.devices)
    if dp is not None:
        try:
            return planner.sharding(v, strategy_of(spec, dp))
        except StrategyError:  # an output dim the split does not divide
            pass
    return planner.sharding(v, strategy_of(spec, (1,) * len(spec.loops)))


def propagate(planner: Planner, configured: dict[str, Strategy]) -> dict[str, Strategy]:
    """A strategy for every operator (configured ones unchanged)."""
    sm = planner.sm
    settled: dict[int, OpSharding] = {}
    queue: deque[int] = deque()
    for op in sm.ops:
        if op.name in configured:
            settled[op.index] = planner.sharding(op.index, configured[op.name])
            queue.append(op.index)
    for seed in [None, *range(len(sm.ops))]:  # first the configured operators' components
        if seed is not None and seed not in settled:
            settled[seed] = start(planner, seed)
            queue.append(seed)
        while queue:
            v = queue.popleft()
            nbrs = [u for u, _, _ in planner.in_edges[v]] + [w for w, _, _ in planner.out_edges[v]]
            for n in nbrs:
                if n not in settled:
                    settled[n] = choose(planner, n, settled)
                    queue.append(n)
    return {op.name: settled[op.index].strategy for op in sm.ops}
