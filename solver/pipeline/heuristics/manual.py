"""Manual sharding (PopRT's manual sharding config, TensorFlow's ``ipu_shard``; seeds 000, 001).

A YAML list of sharding points ``{node: NAME, device: D, stage: S}`` (stage defaults to the
device). From each point, in topological order, every not-yet-assigned ancestor (and the point
itself) gets that device and stage; nodes left unassigned get (largest device + 1, largest
stage + 1). Several points may share a device (parallel branches). The block of a node in the
plan is its device; a tensor consumed in an earlier stage, or on an earlier device, than the one
producing it is refused (the devices must be numbered in pipeline order). When stages and
devices correspond one to one (the file ``mtpp export`` writes for a plan with a placement),
the block is the stage and the device its placement.
"""

from __future__ import annotations

import numpy as np

from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.frontends.sharding_points import (
    ShardPoint,
    parse_sharding,
    read_sharding,
    to_sharding_yaml,
)

__all__ = [
    "ShardPoint",
    "manual_assignment",
    "parse_sharding",
    "read_sharding",
    "to_sharding_yaml",
]


def manual_assignment(g: Graph, points: list[ShardPoint]) -> tuple[np.ndarray, np.ndarray]:
    """(device, stage) of every node from sharding points, as PopRT's manual sharding does."""
    device = np.full(g.n, -1, dtype=np.int64)
    stage = np.full(g.n, -1, dtype=np.int64)
    for p in points:
        g.node(p.node)  # a clear error for an unknown node name
    ordered = sorted(points, key=lambda p: int(g.topo_rank[g.index[p.node]]))
    ptr, idx = g.pred
    for p in ordered:
        start = g.index[p.node]
        if device[start] >= 0:
            continue
        device[start], stage[start] = p.device, p.stage
        todo = [start]
        while todo:
            v = todo.pop()
            for u in idx[ptr[v] : ptr[v + 1]].tolist():
                if device[u] < 0:
                    device[u], stage[u] = p.device, p.stage
                    todo.append(u)
    rest = device < 0
    if rest.any():
        device[rest] = max(p.device for p in points) + 1
        stage[rest] = max(p.stage for p in points) + 1
    bad = np.flatnonzero(stage[g.e_src] > stage[g.e_dst])
    if len(bad):
        u, v = int(g.e_src[bad[0]]), int(g.e_dst[bad[0]])
        raise MtppError(
            f"manual sharding: {g.names[v]!r} (stage {stage[v]}) consumes {g.names[u]!r} from "
            f"the later stage {stage[u]}; a tensor must never go to an earlier stage"
        )
    if stages_are_devices(device, stage) is not None:
        return device, stage  # blocks are the stages, on their devices (a placed plan)
    bad = np.flatnonzero(device[g.e_src] > device[g.e_dst])
    if len(bad):
        u, v = int(g.e_src[bad[0]]), int(g.e_dst[bad[0]])
        raise MtppError(
            f"manual sharding: {g.names[v]!r} (device {device[v]}) consumes {g.names[u]!r} from "
            f"the later device {device[u]}; number the devices in pipeline order"
        )
    return device, stage


def stages_are_devices(device: np.ndarray, stage: np.ndarray) -> np.ndarray | None:
    """The device of each stage 0..S-1 when stages and devices correspond one to one (each
    stage on its own device, stages numbered 0..S-1) and differ from the devices somewhere, as
    in the sharding.yaml that ``mtpp export`` writes for a plan with a placement; else None.

    >>> stages_are_devices(np.array([2, 2, 0]), np.array([0, 0, 1])).tolist()
    [2, 0]
    >>> stages_are_devices(np.array([0, 1]), np.array([0, 1])) is None  # the plain numbering
    True
    """
    pairs = set(zip(stage.tolist(), device.tolist(), strict=True))
    stages = sorted({s for s, _ in pairs})
    if stages != list(range(len(stages))) or len(pairs) != len(stages):
        return None
    if len({d for _, d in pairs}) != len(pairs):
        return None
    placement = np.empty(len(stages), dtype=np.int64)
    for s, d in pairs:
        placement[s] = d
    if np.array_equal(placement, np.arange(len(stages))):
        return None
    return placement
