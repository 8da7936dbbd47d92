"""The exact solver's warm start and first attempt from the exact DPs over ideals.

On graphs that separators cut into small gaps (Llama-shaped decoders), the DP of
:mod:`solver.pipeline.dp.chain_ideals` finds the optimum and proves it; the bound stage of
:func:`solver.pipeline.registry.solve` has usually computed it already (it is cached on the graph).
On graphs with data edges that are not order edges (training graphs: gradients go back, and
some backward nodes have no order edge at all), that DP does not apply; when their ideals are
few, the DP of :func:`solver.pipeline.dp.ideals.solve_ideals` proves the optimum instead
(:func:`ideals_first`, cached too). A proven optimum needs no CP-SAT search: :func:`proven_plan`
returns it as the exact method's plan, with the proof named.
"""

from __future__ import annotations

import math
import time

import numpy as np

from solver.core.cluster import Cluster
from solver.core.errors import MtppError
from solver.core.graph import Graph, coarse_view
from solver.pipeline.dp.chain_ideals import ChainResult, ideal_chain
from solver.pipeline.dp.ideals import IdealTimeout, solve_ideals
from solver.pipeline.plan import OPTIMAL, Plan, make_plan


def skips_search(res: ChainResult | None) -> bool:
    """True when the DP proved its plan optimal: no search can improve it, and the DP's own
    tie-break is exact (CP-SAT would spend its time and memory, 2.4 GB for the Llama-2-7B
    shape at k = 64, to prove less)."""
    return res is not None and res.optimal


FIRST_MAX_IDEALS = 6_000  # ideals of the first attempt (its blocks grow as their square)
FIRST_SHARE = 0.25  # of the time limit, at most, for the first attempt (as the warm start's)
CHAIN_PROOF = (
    "exact DP over the ideals of the separator chain (docs/bounds.md); no CP-SAT search needed"
)
IDEALS_PROOF = (
    "exact DP over the ideals of the nodes with order edges, the nodes without one priced by a "
    "relaxation that its plan meets (solver/pipeline/dp/ideals.py); no CP-SAT search needed"
)


def chain_warm_start(g: Graph, cluster: Cluster, deadline: float) -> ChainResult | None:
    """The DPs' result on k = ``cluster.devices`` blocks (cached, or computed by ``deadline``,
    a ``time.perf_counter()`` value): the separator chain's, else the first attempt's
    (:func:`ideals_first`) where that one applies; None on a cluster whose devices or links
    differ, and on a small graph the bound stage did not run the chain's DP on."""
    left = max(0.0, deadline - time.perf_counter())
    chain = ideal_chain(g, cluster, cluster.devices, 0.0, left)
    if chain is not None and chain.optimal:
        return chain
    first = ideals_first(g, cluster, max(0.0, deadline - time.perf_counter()))
    if first is not None and (chain is None or first.optimal or first.value < chain.value):
        return first
    return chain


def first_attempt_applies(cg: Graph) -> bool:
    """True when some data edge of the coarse graph ``cg`` is not an order edge (the separator
    chain's DP does not apply there; training graphs)."""
    order = set((cg.e_src * cg.n + cg.e_dst).tolist())
    du, dv = cg.data_edges
    cross = du != dv
    return any(x not in order for x in (du[cross] * cg.n + dv[cross]).tolist())


def ideals_first(g: Graph, cluster: Cluster, time_limit: float) -> ChainResult | None:
    """The DP over ideals (:func:`solve_ideals`) on k = ``cluster.devices`` blocks, tried
    before the bounds and the search on graphs where :func:`first_attempt_applies` and the
    ideals are at most :data:`FIRST_MAX_IDEALS`; computed once per graph, cluster and k. None
    where it does not apply, has too many ideals or runs out of ``time_limit`` seconds."""
    if not cluster.homogeneous:
        return None
    cg, _ = coarse_view(g)
    if not first_attempt_applies(cg):
        return None
    cache = g.__dict__.setdefault("_ideals_first", {})  # the graph is immutable
    key = (
        cluster.devices,
        cluster.fast_memory,
        cluster.capacity,
        cluster.link_bandwidth,
        cluster.slow_memory_bandwidth,
    )
    if key not in cache:
        try:
            cache[key] = _run_ideals(cg, cluster, time_limit)
        except IdealTimeout:  # out of time: not cached, a later call with more time retries
            return None
    return cache[key]


def _run_ideals(cg: Graph, cluster: Cluster, time_limit: float) -> ChainResult | None:
    """The DP's result as a ChainResult (on ``cg``); None past the caps on ideals and pairs.
    Raises :class:`IdealTimeout` at the time limit."""
    try:
        res = solve_ideals(
            cg, cluster, cluster.devices, time_limit=time_limit, max_ideals=FIRST_MAX_IDEALS
        )
    except IdealTimeout:
        raise
    except MtppError:  # more ideals or pairs than the caps
        return None
    if math.isinf(res.lower):  # no chain fits the capacity: leave the proof to the bounds
        return None
    return ChainResult(
        lower=res.lower,
        value=res.value,
        assignment=res.assignment,
        stats=dict(res.stats, proof=IDEALS_PROOF),
        before_tie_break=res.before_tie_break,
    )


def hint_of(res: ChainResult | None, g: Graph) -> tuple[float, np.ndarray | None]:
    """The DP's best plan on the original graph, as (objective, assignment)."""
    if res is None or res.assignment is None:
        return float("inf"), None
    _, labels = coarse_view(g)
    return res.value, res.assignment[labels]


def proven_plan(
    g: Graph, cluster: Cluster, res: ChainResult, method: str, t0: float, tie_break: bool = True
) -> Plan:
    """The DP's proven optimum as ``method``'s plan (``res.optimal`` must hold)."""
    _, labels = coarse_view(g)
    ca = res.assignment if tie_break or res.before_tie_break is None else res.before_tie_break
    first = "proof" in res.stats  # the first attempt's DP (ideals_first), not the chain's
    stats = {
        "proof": res.stats["proof"] if first else CHAIN_PROOF,
        "bound_source": "ideals",  # the certified bound that proves it
        "ideals_dp" if first else "chain_dp": {
            key: v for key, v in res.stats.items() if key not in ("tie_break", "proof")
        },
        "tie_break": res.stats.get("tie_break", {"summary": "tie-break skipped"})
        if tie_break
        else {"summary": "tie-break skipped (tie_break=false)"},
    }
    return make_plan(
        g,
        cluster,
        ca[labels],
        method,
        lower_bound=res.lower,
        status=OPTIMAL,
        wall_seconds=time.perf_counter() - t0,
        stats=stats,
    )
