"""Shared fixtures and hypothesis strategies: random small DAGs with every cost feature.

Hypothesis profiles (registered here):

- ``ci``, the default of ``python -m pytest``: derandomized, so every run draws the same
  examples and CI passes or fails for a reason, never by chance. Each property test runs
  ``scaled_examples(n)`` examples, n in CI.
- ``deep``, for searching (``python -m pytest tests/test_topology.py --hypothesis-profile
  deep --hypothesis-show-statistics``): random, :data:`DEEP_FACTOR` times more examples
  per property test (thousands for most). What it finds is fixed and kept as an explicit
  ``@example`` on the property, so CI then checks it on every run.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st

from solver.core.cluster import Cluster
from solver.core.graph import Graph
from solver.experiments import benchdata

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
BENCH = SHARED / "benchmarks" / "dnn-partitioning" / "throughput-inputs"

KNOWN_OPTIMA = benchdata.KNOWN_OPTIMA  # key -> (nodes, k, optimum): the package's table

CI_EXAMPLES = 100  # the ci profile's max_examples (Hypothesis' default)
DEEP_FACTOR = 20  # the deep profile runs this many times more examples per property test
settings.register_profile(
    "ci", max_examples=CI_EXAMPLES, derandomize=True, deadline=None, print_blob=True
)
settings.register_profile(
    "deep", max_examples=DEEP_FACTOR * CI_EXAMPLES, deadline=None, print_blob=True
)
# pytest loads this file before Hypothesis' plugin applies --hypothesis-profile, so a profile
# named on the command line wins; without one, ci
if settings.get_current_profile_name() == "default":
    settings.load_profile("ci")


def scaled_examples(ci_count: int) -> int:
    """A property test's max_examples: ``ci_count`` under the ci profile, as many times more
    under another as its max_examples is larger (deep: DEEP_FACTOR times). A test's own
    ``@settings(max_examples=...)`` would otherwise override every profile."""
    return max(1, round(ci_count * settings.default.max_examples / CI_EXAMPLES))


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
