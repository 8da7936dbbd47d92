"""The manual-sharding YAML format (PopRT manual sharding points): read, validate, write.

A YAML list of ``{node: NAME, device: D, stage: S}`` (stage defaults to the device), or a
mapping with that list under ``sharding``.
:func:`solver.pipeline.heuristics.manual.manual_assignment`
turns the points into a plan; :func:`to_sharding_yaml` writes points that map back to a plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from solver.core.cluster import MAX_DEVICES
from solver.core.errors import MtppError
from solver.core.files import read_yaml, shown
from solver.core.graph import MAX_NAME_CHARS, Graph


@dataclass(frozen=True)
class ShardPoint:
    node: str
    device: int
    stage: int


def read_sharding(path: str | Path) -> list[ShardPoint]:
    """Parse and validate a manual-sharding YAML file."""
    return parse_sharding(read_yaml(path, "sharding file"), str(path))


def parse_sharding(data: object, where: str = "sharding") -> list[ShardPoint]:
    """Validate parsed sharding points: names are strings (or YAML numbers), device and stage
    whole numbers below MAX_DEVICES (booleans, floats and huge numbers are refused)."""
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
            if not isinstance(val, int) or isinstance(val, bool) or not 0 <= val < MAX_DEVICES:
                raise MtppError(
                    f"{where}: entry {i}: {key} must be a whole number from 0 to "
                    f"{MAX_DEVICES - 1}, got {shown(val)}"
                )
        node = item["node"]
        if isinstance(node, bool) or not isinstance(node, (str, int)):
            raise MtppError(f"{where}: entry {i}: node must be a node name, got {shown(node)}")
        if len(str(node)) > MAX_NAME_CHARS:
            raise MtppError(
                f"{where}: entry {i}: node name longer than {MAX_NAME_CHARS} characters"
            )
        out.append(ShardPoint(str(node), dev, stage))
    return out


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
