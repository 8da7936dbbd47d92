"""Shared fixtures and hypothesis strategies: random small DAGs with every cost feature."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import strategies as st

from solver import benchdata
from solver.cluster import Cluster
from solver.graph import Graph

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
BENCH = SHARED / "benchmarks" / "dnn-partitioning" / "throughput-inputs"

KNOWN_OPTIMA = benchdata.KNOWN_OPTIMA  # key -> (nodes, k, optimum): the package's table


def bench_path(key: str) -> Path:
    p = BENCH / f"{key}.json"
    if not p.exists():
        pytest.skip(f"benchmark data not found at {p} (../shared is absent)")
    return p


@st.composite
def problems(draw, max_nodes: int = 7, max_k: int = 3, features: bool = True):
    """A random (graph, cluster) with shared params, multicast, overflow, capacity, groups."""
    n = draw(st.integers(2, max_nodes))
    k = draw(st.integers(1, max_k))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    density = draw(st.sampled_from([0.2, 0.4, 0.7]))
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < density]
    # integer-ish costs create ties, the hard case for bounds and symmetry breaking
    work = rng.integers(0, 6, n).astype(float) if rng.random() < 0.5 else rng.random(n) * 5
    sizeout = rng.integers(0, 5, n).astype(float) * (rng.random() < 0.9)
    ordered = None
    params = []
    colocate = []
    act = None
    fast, cap, bm = math.inf, None, 1.0
    if features:
        if edges and rng.random() < 0.25:
            ordered = rng.random(len(edges)) < 0.7
        for q in range(rng.integers(0, 4)):
            users = rng.choice(n, size=rng.integers(1, min(n, 3) + 1), replace=False)
            params.append((f"p{q}", float(rng.integers(1, 6)), users.tolist()))
        if rng.random() < 0.3:
            act = rng.integers(0, 4, n).astype(float)
        if rng.random() < 0.4:
            fast = float(rng.integers(2, 10))
            bm = float(rng.choice([0.5, 1.0, 4.0]))
        if rng.random() < 0.3:
            cap = float(rng.integers(6, 16))
        if n >= 3 and rng.random() < 0.2:
            colocate = [rng.choice(n, size=2, replace=False).tolist()]
    g = Graph.build(
        [f"v{i}" for i in range(n)],
        work,
        sizeout,
        edges,
        ordered=ordered,
        params=params,
        act=act,
        colocate=colocate,
        name="random",
    )
    cluster = Cluster(
        name="toy",
        devices=k,
        fast_memory=fast,
        capacity=cap,
        link_bandwidth=float(rng.choice([0.5, 1.0, 2.0])),
        slow_memory_bandwidth=bm,
    )
    return g, cluster
