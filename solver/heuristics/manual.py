"""Manual sharding (PopRT's manual sharding config, TensorFlow's ``ipu_shard``; seeds 000, 001).

A YAML list of sharding points ``{node: NAME, device: D, stage: S}`` (stage defaults to the
device). From each point, in topological order, every not-yet-assigned ancestor (and the point
itself) gets that device and stage; nodes left unassigned get (largest device + 1, largest
stage + 1). Several points may share a device (parallel branches). The block of a node in the
plan is its device; a tensor consumed in an earlier stage than the one producing it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from solver.errors import MtppError
from solver.files import read_yaml
from solver.graph import Graph


@dataclass(frozen=True)
class ShardPoint:
    node: str
    device: int
    stage: int


def read_sharding(path: str | Path) -> list[ShardPoint]:
    """Parse and validate a manual-sharding YAML file."""
    return parse_sharding(read_yaml(path, "sharding file"), str(path))


def parse_sharding(data: object, where: str = "sharding") -> list[ShardPoint]:
    if isinstance(data, dict) and "sharding" in data:
        data = data["sharding"]
    if not isinstance(data, list) or not data:
        raise MtppError(f"{where}: expected a list of {{node, device, stage}} entries")
    out = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or "node" not in item or "device" not in item:
            raise MtppError(f"{where}: entry {i} needs 'node' and 'device' (and optional 'stage')")
        extra = set(item) - {"node", "device", "stage"}
        if extra:
            raise MtppError(f"{where}: entry {i} has unknown key {sorted(extra)[0]!r}")
        dev, stage = item["device"], item.get("stage", item["device"])
        for key, val in (("device", dev), ("stage", stage)):
            if not isinstance(val, int) or isinstance(val, bool) or val < 0:
                raise MtppError(f"{where}: entry {i}: {key} must be a whole number >= 0")
        out.append(ShardPoint(str(item["node"]), int(dev), int(stage)))
    return out


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
    return device, stage


def to_sharding_yaml(g: Graph, device: np.ndarray, stage: np.ndarray | None = None) -> str:
    """Sharding points that :func:`manual_assignment` maps back to exactly this plan.

    A node is a point when it has no successor in its own block or a successor outside it.
    Then a later block's walk never claims an earlier block's node first: on any path that
    leaves a block there is a point of that block, and it comes earlier in topological order.
    """
    stage = device if stage is None else stage
    same = device[g.e_src] == device[g.e_dst]
    inside = np.zeros(g.n, dtype=bool)
    outside = np.zeros(g.n, dtype=bool)
    inside[g.e_src[same]] = True
    outside[g.e_src[~same]] = True
    points = [
        {"node": g.names[v], "device": int(device[v]), "stage": int(stage[v])}
        for v in g.topo_order.tolist()
        if outside[v] or not inside[v]
    ]
    return yaml.safe_dump(points, sort_keys=False)
