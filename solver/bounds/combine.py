"""The certified lower bound of a problem: every bound computed, the largest one reported."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from solver.bounds.chain import chain_bound, work_chain_bound
from solver.bounds.chain_io import chain_io_bound
from solver.bounds.decision import decision_bound, work_packing_bound
from solver.bounds.items import items
from solver.bounds.weights import capacity_infeasible, weights_bound
from solver.cluster import Cluster
from solver.graph import Graph, coarse_view

# share of the time limit each CP-SAT packing bound may spend; the chains without io are
# instant and the chains with io take the rest
SHARES = {"weights": 0.1, "decision": 0.15, "work packing": 0.1}
IDEALS_SHARE = 0.8  # the exact DP over the ideals of the separator chain goes first ...
IDEALS_MIN_SECONDS = 3.0  # ... when the bounds have at least this long (else it goes last)
IDEALS_MIN_NODES = 300  # ... on graphs of at least this many coarse nodes (smaller ones are
# solved exactly by CP-SAT in seconds, which also reports its own proof)


@dataclass(frozen=True)
class BoundReport:
    """A lower bound no plan can beat, the bound that gives it, and every bound's value.

    ``value`` is ``inf`` only when it is proven that no plan meets the hard capacity.
    """

    value: float
    binding: str
    bounds: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def infeasible(self) -> bool:
        """True when no plan exists (the weights cannot fit under the capacity C)."""
        return math.isinf(self.value)

    def to_dict(self) -> dict:
        return {
            "value": self.value,
            "binding": self.binding,
            "bounds": dict(self.bounds),
            "seconds": self.seconds,
        }


def certified_lower_bound(
    g: Graph,
    cluster: Cluster,
    time_limit: float = 5.0,
    k: int | None = None,
    ideals: bool = True,
) -> BoundReport:
    """Every bound of docs/bounds.md for ``g`` on ``cluster`` with k blocks (default: its
    devices); the value is their maximum, so it holds for every valid plan. When the exact DP
    over the ideals (``ideals``) proves the optimum, the other relaxations are not computed:
    none can be larger."""
    from solver.cost import lower_bound

    t0 = time.perf_counter()
    k = cluster.devices if k is None else int(k)
    it = items(g)
    if capacity_infeasible(it, cluster, k, min(1.0, 0.1 * time_limit)):
        return BoundReport(math.inf, "capacity", {"capacity": math.inf}, time.perf_counter() - t0)
    vals = {"universal": float(lower_bound(g, cluster, k))}
    vals["chain"] = chain_bound(g, it, cluster, k)
    vals["work chain"] = work_chain_bound(g, it, k)
    # the DP goes first with most of the time when there is enough of it (it is the only bound
    # that can be exact); with a short budget (evaluate's) the relaxations go first
    first = ideals and time_limit >= IDEALS_MIN_SECONDS
    if first:
        dp = ideal_chain(g, cluster, k, max(vals.values()), IDEALS_SHARE * time_limit)
        if dp is not None and dp.lower > 0:
            vals["ideals"] = dp.lower
            if dp.optimal:  # the exact optimum: no other bound can be larger
                return _report(vals, t0)
    for name, fn in (
        ("weights", lambda t: weights_bound(it, cluster, k, t)),
        ("decision", lambda t: decision_bound(it, cluster, k, t)),
        ("work packing", lambda t: work_packing_bound(it, k, t)),
    ):
        vals[name] = fn(SHARES[name] * time_limit)
    # the io chains refine the io-free chains (valid starting points); they share what is left
    # (with memory only when memory binds at all: otherwise the work chain is the one to refine)
    left = max(0.0, time_limit - (time.perf_counter() - t0))
    vals["chain io"] = (
        chain_io_bound(g, it, cluster, k, vals["chain"], left / 2) if vals["chain"] > 0 else 0.0
    )
    left = max(0.0, time_limit - (time.perf_counter() - t0))
    vals["work io chain"] = chain_io_bound(g, it, cluster, k, vals["work chain"], left, False)
    if ideals and not first:
        left = max(0.0, time_limit - (time.perf_counter() - t0))
        dp = ideal_chain(g, cluster, k, max(vals.values()), left)
        if dp is not None and dp.lower > 0:
            vals["ideals"] = dp.lower
    return _report(vals, t0)


def _report(vals: dict, t0: float) -> BoundReport:
    vals = {key: float(v) for key, v in vals.items()}
    name = max(vals, key=lambda x: vals[x])
    return BoundReport(vals[name], name, vals, time.perf_counter() - t0)


def ideal_chain(g: Graph, cluster: Cluster, k: int, lower: float, time_limit: float):
    """The exact DP over the ideals of ``g``'s separator chain
    (:mod:`solver.heuristics.chain_ideals`) on its coarse view, computed once per graph,
    cluster and k (the warm start of the exact solver reads the same result); None on a
    cluster whose devices or links differ and on small graphs."""
    from solver.heuristics.chain_ideals import chain_ideal_dp

    cg, _ = coarse_view(g)
    if not cluster.homogeneous or cg.n < IDEALS_MIN_NODES:
        return None
    cache = g.__dict__.setdefault("_chain_ideals", {})  # the graph is immutable
    key = (
        k,
        cluster.fast_memory,
        cluster.capacity,
        cluster.link_bandwidth,
        cluster.slow_memory_bandwidth,
    )
    hit, state = cache.get(key, (None, {}))
    if hit is None or (not hit.optimal and "stopped" in hit.stats):
        hit = chain_ideal_dp(
            cg, cluster, k, max(lower, hit.lower if hit else 0.0), time_limit, state=state
        )  # resumes a run its deadline stopped
        cache[key] = (hit, state)
    return hit
