"""Generated workloads: random layered DAGs of any size, shaped like networks (chains of
blocks with skip edges), for scaling experiments and benchmarks."""

from __future__ import annotations

import numpy as np

from solver.core.graph import Graph


def layered_dag(n: int, width: int = 4, skip: float = 0.1, seed: int = 0) -> Graph:
    """``n`` nodes in layers of ``width``; each node reads 1-2 nodes of the previous layer and
    sometimes a node further back (residuals); about half the nodes own a weight."""
    rng = np.random.default_rng(seed)
    layer = np.arange(n) // width
    src, dst = [], []
    for v in range(width, n):
        prev = np.arange((layer[v] - 1) * width, layer[v] * width)
        for u in rng.choice(prev, size=min(len(prev), rng.integers(1, 3)), replace=False):
            src.append(int(u))
            dst.append(v)
        if rng.random() < skip and layer[v] > 2:
            src.append(int(rng.integers(0, (layer[v] - 2) * width)))
            dst.append(v)
    work = rng.gamma(2.0, 1e-4, n)
    sizeout = rng.integers(1, 64, n) * 2**14
    owners = np.flatnonzero(rng.random(n) < 0.5)
    params = [(f"w{v}", float(rng.integers(1, 256) * 2**16), [int(v)]) for v in owners]
    return Graph.build(
        [f"n{i}" for i in range(n)],
        work,
        sizeout.astype(float),
        np.stack([src, dst], 1),
        params=params,
        name=f"layered-{n}",
    )
