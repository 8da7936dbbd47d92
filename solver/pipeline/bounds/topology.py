"""The certified bound on a cluster whose devices or links differ: the bounds of
:func:`solver.pipeline.bounds.certified_lower_bound` on the cluster's relaxation, the universal
bound on
the cluster itself, and the group-labelled chains that see the slow links between groups."""

from __future__ import annotations

import math
import time
from dataclasses import replace

from solver.core.cluster import Cluster
from solver.core.cost import lower_bound
from solver.core.graph import Graph
from solver.pipeline.bounds.chain_groups import group_chain_bound
from solver.pipeline.bounds.combine import BoundReport, certified_lower_bound

RELAXATION_SHARE = 0.75  # of the time limit; the group chains have the rest (at least 25%)


def topology_bound(g: Graph, cluster: Cluster, time_limit: float) -> BoundReport:
    """Every bound of docs/bounds.md that holds for every plan on every placement of
    ``cluster``'s blocks on its devices; the value is the largest."""
    t0 = time.perf_counter()
    flat, speedup = cluster.relaxation()
    fast_g = g if speedup == 1.0 else replace(g, work=g.work / speedup)
    rep = certified_lower_bound(fast_g, flat, time_limit=RELAXATION_SHARE * time_limit)
    vals = {**rep.bounds, "universal": float(lower_bound(g, cluster))}
    if not rep.infeasible:
        left = max(0.0, time_limit - (time.perf_counter() - t0))
        memory = not math.isinf(flat.fast_memory)
        lo = vals.get("work io chain", 0.0)
        vals["group work io chain"] = group_chain_bound(
            g, cluster, lo, left / 2 if memory else left
        )
        if memory:
            left = max(0.0, time_limit - (time.perf_counter() - t0))
            lo = vals.get("chain io", 0.0)
            vals["group chain io"] = group_chain_bound(g, cluster, lo, left, memory=True)
    name = max(vals, key=lambda x: vals[x])
    return BoundReport(vals[name], name, vals, time.perf_counter() - t0)
