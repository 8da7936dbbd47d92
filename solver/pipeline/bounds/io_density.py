"""The io density every block pays: a decision bound that charges each node a share of the io
of the block holding it.

For mu >= 0 let m_mu(v) be the least ``io(S) + mu * work(S)`` over node sets S holding v (a
minimum cut of the node block's network, :mod:`solver.pipeline.bounds.node_block`, with the
sink edges weighted by mu). A block S of a plan with every block at most T holds v and has
``work(S) <= T``, so ``io(S) >= m_mu(v) - mu * work(S)``, hence with
``rho = m_mu(v) / T - mu``: ``rho * work(S) <= m_mu(v) - mu * work(S) <= io(S)`` (when
rho >= 0). Taking the best mu of a grid, ``rho_T(v) = max(0, max_mu m_mu(v) / T - mu)``
gives ``io(S) >= rho_T(v) * work(S)`` for every v in S, and so (the largest of them is at
least their work-weighted mean) ``io(S) >= sum over v in S of rho_T(v) * work(v)``: each node
is charged ``rho_T(v) * work(v)`` and the charges are io, as the decision io bound's are
(:func:`solver.pipeline.bounds.decision.decision_io_bound` packs their volume). The cuts are
computed once (capacities rounded down: never above m_mu) and serve every probe T; a node
whose cuts did not finish in time is charged nothing. Proof and measurements: docs/bounds.md,
"io density".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.graph import Graph
from solver.pipeline.bounds.decision import io_volume_exceeds, largest_proven
from solver.pipeline.bounds.items import Items
from solver.pipeline.bounds.node_block import cut_network, min_block_cost

MAX_NODES = 400  # n cuts per grid value, each on an n-node network: larger graphs skip it
# the grid of work weights mu (io seconds per work second): a block of a layered DAG pays
# about 1-8% of its work in io; the best mu of a node is near its block's io share / (k - 1)
# (on the 100-node layered DAG at k = 16 most nodes' best mu is 0.0006-0.0018); cut in this
# order, the likeliest first, so that a search the clock stops keeps the useful ones
MU_GRID = tuple(0.000625 * 2 ** (j / 2) for j in (0, 1, 2, -1, 3, -2, 4, -3, 5, -4, 6, -6, 7, -8))
SLACK = 1e-9  # relative: a charge is shrunk by this so a floating sum never proves by rounding


@dataclass(frozen=True)
class IoDensity:
    """``cuts[v, j]``: a lower bound of m_mu(v) for ``mu = mus[j]`` (0 where not computed);
    ``work`` per coarse node; ``complete``: every cut was computed."""

    cuts: np.ndarray
    mus: np.ndarray
    work: np.ndarray
    complete: bool

    def charges(self, T: float) -> np.ndarray:
        """Per coarse node, the io it is charged in every plan with every block at most T."""
        if T <= 0:
            return np.zeros_like(self.work)
        rho = np.maximum(0.0, (self.cuts / T - self.mus).max(axis=1))
        return rho * self.work * (1 - SLACK)


def singleton_density(cg: Graph, cluster: Cluster, mus: tuple[float, ...] = MU_GRID) -> IoDensity:
    """The charges with every cut replaced by its set {v} alone (``io({v}) + mu * work(v)``,
    at least every cut): an upper end of the io density's charges at every T, so when these
    prove nothing above a bound, no cut can (no cut is computed)."""
    mu = np.array(mus)
    io = np.zeros(cg.n)
    for t in range(cg.num_tensors):
        ends = np.unique(np.append(cg.t_cons[cg.t_ptr[t] : cg.t_ptr[t + 1]], cg.t_producer[t]))
        if len(ends) > 1:
            io[ends] += float(cg.t_size[t]) / cluster.link_bandwidth
    work = cg.work.astype(float)
    return IoDensity(io[:, None] + work[:, None] * mu[None, :], mu, work, True)


def io_density(
    cg: Graph, cluster: Cluster, deadline: float = math.inf, mus: tuple[float, ...] = MU_GRID
) -> IoDensity | None:
    """The cuts of every node of the coarse graph ``cg`` for every mu of ``mus`` (None above
    MAX_NODES nodes or on a cluster whose devices or links differ); the cuts stop at
    ``deadline`` (a ``time.perf_counter()`` value), leaving zeros."""
    if cg.n > MAX_NODES or not cluster.homogeneous:
        return None
    mus = np.array(mus)
    cuts = np.zeros((cg.n, len(mus)))
    # nodes by decreasing work: they carry the largest charges
    order = np.argsort(-cg.work, kind="stable").tolist()
    for j, mu in enumerate(mus.tolist()):
        cn = cut_network(cg, cluster, work_weight=mu)
        for v in order:
            if time.perf_counter() > deadline:
                return IoDensity(cuts, mus, cg.work.astype(float), False)
            cuts[v, j] = min_block_cost(cn, v)
    return IoDensity(cuts, mus, cg.work.astype(float), True)


def io_density_bound(
    it: Items,
    dens: IoDensity,
    cluster: Cluster,
    k: int,
    seconds: float,
    lo: float,
    hi: float = math.inf,
) -> float:
    """Largest T proven in [``lo``, ``hi``] (``lo``, proven by the caller, when none above it
    is): the works plus the density charges at T exceed the volume of k bins (with memory as
    the decision io bound's, :func:`solver.pipeline.bounds.decision.io_volume_exceeds`).
    Without ``hi`` the search ends where one block holds everything."""
    if not math.isfinite(hi):
        hi = float(it.work.sum())
        if math.isfinite(cluster.fast_memory):
            hi += float(it.charged.sum() + it.act.max()) / cluster.slow_memory_bandwidth
    t_end = time.perf_counter() + seconds
    return largest_proven(lambda T: io_volume_exceeds(it, dens, cluster, k, T), lo, hi, t_end)
