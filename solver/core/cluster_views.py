"""The cluster one SPMD program sees: every device runs the same program in lockstep, so it is
priced at the slowest device's compute and must fit the smallest capacity of its devices.

:func:`sub_cluster` moved here from solver/joint/submesh.py (which re-exports it) so that
sharding does not depend on the joint planner.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from solver.core.cluster import Cluster, Topology


def sub_cluster(cluster: Cluster, devices, memory: float | None = None) -> Cluster:
    """The cluster of ``devices`` alone, renumbered 0..n-1 in that order: their groups and
    links kept, the slowest device's compute, the smallest fast memory and capacity (or
    ``memory`` for every device when given), so that one SPMD program is priced by its
    slowest device and fits in its smallest."""
    devices = list(devices)
    memory_arr, capacity, compute = cluster.device_arrays()
    idx = np.asarray(devices, dtype=np.int64)
    cap = float(capacity[idx].min()) if memory is None else float(memory)
    topology = None
    t = cluster.topology
    if t is not None:
        pos = {d: i for i, d in enumerate(devices)}
        kept = [
            (name, tuple(pos[d] for d in members if d in pos), link)
            for name, members, link in zip(t.names, t.groups, t.links, strict=True)
        ]
        kept = [k for k in kept if k[1]]
        topology = Topology(
            groups=tuple(m for _, m, _ in kept),
            names=tuple(n for n, _, _ in kept),
            links=tuple(lk for _, _, lk in kept),
            between=t.between if len(kept) > 1 else None,
        )
    return replace(
        cluster,
        name=f"{cluster.name}[{','.join(map(str, devices))}]",
        devices=len(devices),
        fast_memory=float(memory_arr[idx].min()),
        capacity=None if math.isinf(cap) else cap,
        compute=float(compute[idx].min()),
        topology=topology,
    )


def lockstep(cluster: Cluster) -> Cluster:
    """``cluster`` with its per-device compute, fast memory and capacity replaced by the
    slowest and smallest (links kept): itself when it states none per device."""
    if cluster.topology is None:
        return cluster
    return replace(sub_cluster(cluster, range(cluster.devices)), name=cluster.name)
