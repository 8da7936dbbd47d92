"""The exact solver's warm start from the exact DP over the separator chain.

On graphs that separators cut into small gaps (Llama-shaped decoders), the DP of
:mod:`solver.pipeline.dp.chain_ideals` finds the optimum and proves it; the bound stage of
:func:`solver.pipeline.registry.solve` has usually computed it already (it is cached on the graph).
A
proven optimum needs no CP-SAT search: :func:`proven_plan` returns it as the exact method's
plan, with the DP's tie-break (least transferred bytes, then latency) and the proof named.
"""

from __future__ import annotations

import time

import numpy as np

from solver.core.cluster import Cluster
from solver.core.graph import Graph, coarse_view
from solver.pipeline.dp.chain_ideals import ChainResult, ideal_chain
from solver.pipeline.plan import OPTIMAL, Plan, make_plan


def skips_search(res: ChainResult | None) -> bool:
    """True when the DP proved its plan optimal: no search can improve it, and the DP's own
    tie-break is exact (CP-SAT would spend its time and memory, 2.4 GB for the Llama-2-7B
    shape at k = 64, to prove less)."""
    return res is not None and res.optimal


def chain_warm_start(g: Graph, cluster: Cluster, deadline: float) -> ChainResult | None:
    """The DP's result on k = ``cluster.devices`` blocks (cached, or computed by ``deadline``,
    a ``time.perf_counter()`` value); None on a cluster whose devices or links differ, and on
    a small graph the bound stage did not run it on."""
    left = max(0.0, deadline - time.perf_counter())
    return ideal_chain(g, cluster, cluster.devices, 0.0, left)


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
    stats = {
        "proof": "exact DP over the ideals of the separator chain (docs/bounds.md); "
        "no CP-SAT search needed",
        "bound_source": "ideals",  # the certified bound that proves it
        "chain_dp": {key: v for key, v in res.stats.items() if key != "tie_break"},
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
