"""Candidate sub-meshes of a cluster for pipeline stages, and the links between them.

Devices are taken in *cluster order* (the groups one after the other, each in its listed
order), and a stage's devices are a run of that order aligned to the topology:

- inside one group of g devices: runs of s devices, s dividing g, starting at a multiple of s
  within the group; mesh ``(s,)`` (every link inside a group is alike);
- whole groups: m >= 2 consecutive groups, mesh ``(m, g)`` when they all hold g devices (axis
  0 crosses groups, axis 1 stays inside one) and its 1-D form ``(m * g,)``.

A sub-mesh runs one SPMD program: at the slowest device's compute, within the smallest
capacity of its devices (:func:`sub_cluster`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.cluster_views import sub_cluster  # noqa: F401  (moved there; re-exported)
from solver.spmd.mesh import Mesh, mesh_on

SPACES = ("joint", "pipeline", "sharding")


@dataclass(frozen=True)
class SubMesh:
    """``devices`` (cluster ids, row-major over ``mesh.shape``) starting at position ``start``
    of the cluster order."""

    devices: tuple[int, ...]
    mesh: Mesh
    start: int

    @property
    def size(self) -> int:
        return len(self.devices)

    @property
    def end(self) -> int:
        return self.start + len(self.devices)


def device_order(cluster: Cluster) -> list[int]:
    """The cluster's devices group after group: the order stages take them in."""
    return [d for g in cluster.groups for d in g]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(cluster: Cluster, space: str = "joint") -> list[SubMesh]:
    """Every sub-mesh a stage may run on in ``space`` (see the module docstring):
    ``pipeline`` keeps single devices, ``sharding`` the meshes over all devices."""
    if space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, got {space!r}")
    order = device_order(cluster)
    groups = cluster.groups
    offsets = np.cumsum([0] + [len(g) for g in groups]).tolist()
    shapes: list[tuple[int, tuple[int, ...]]] = []  # (start, shape)
    for gi, g in enumerate(groups):
        for s in _divisors(len(g)):
            if space == "pipeline" and s != 1:
                continue
            for j in range(0, len(g), s):
                shapes.append((offsets[gi] + j, (s,)))
    if space != "pipeline":
        for a in range(len(groups)):
            for b in range(a + 2, len(groups) + 1):
                sizes = {len(g) for g in groups[a:b]}
                n = offsets[b] - offsets[a]
                shapes.append((offsets[a], (n,)))
                if len(sizes) == 1 and min(sizes) > 1:
                    shapes.append((offsets[a], (b - a, len(groups[a]))))
    out = []
    for start, shape in shapes:
        n = math.prod(shape)
        if space == "sharding" and n != cluster.devices:
            continue
        devs = tuple(order[start : start + n])
        out.append(SubMesh(devs, mesh_on(cluster, devs, shape), start))
    if space == "sharding" and not out:
        out.append(SubMesh(tuple(order), mesh_on(cluster, order, (len(order),)), 0))
    return sorted(set(out), key=lambda m: (m.start, m.size, m.mesh.shape))


def stage_limit(cluster: Cluster, devices, memory: float | None) -> float | None:
    """The memory limit per device of a stage on ``devices``: ``memory`` when given, else the
    smallest capacity among them (None: no limit)."""
    if memory is not None:
        return float(memory)
    _, capacity, _ = cluster.device_arrays()
    c = float(capacity[np.asarray(list(devices), dtype=np.int64)].min())
    return None if math.isinf(c) else c


def slowest_link(cluster: Cluster, src, dst) -> float:
    """The least bandwidth of ``cluster.link(a, b)`` over a in ``src``, b in ``dst``."""
    a, b = np.meshgrid(np.asarray(list(src)), np.asarray(list(dst)), indexing="ij")
    a, b = a.ravel(), b.ravel()
    same = a == b
    if same.all():
        return math.inf
    bw, _ = cluster.link_arrays(a[~same], b[~same])
    return float(bw.min())


def transfer_time(nbytes: float, cluster: Cluster, src, dst) -> float:
    """Seconds to move a tensor of ``nbytes`` from the devices ``src`` to ``dst``: both sides
    pay B / (min(|src|, |dst|) * bw), bw the slowest link between them (docs/joint.md)."""
    if nbytes == 0:
        return 0.0
    bw = slowest_link(cluster, src, dst)
    return nbytes / (min(len(src), len(dst)) * bw)
