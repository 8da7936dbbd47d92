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
from solver.graph import Graph

# share of the time limit each CP-SAT packing bound may spend; the chains without io are
# instant and the chains with io take the rest
SHARES = {"weights": 0.1, "decision": 0.15, "work packing": 0.1}


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
    g: Graph, cluster: Cluster, time_limit: float = 5.0, k: int | None = None
) -> BoundReport:
    """Every bound of docs/bounds.md for ``g`` on ``cluster`` with k blocks (default: its
    devices); the value is their maximum, so it holds for every valid plan."""
    from solver.cost import lower_bound

    t0 = time.perf_counter()
    k = cluster.devices if k is None else int(k)
    it = items(g)
    if capacity_infeasible(it, cluster, k, min(1.0, 0.1 * time_limit)):
        return BoundReport(math.inf, "capacity", {"capacity": math.inf}, time.perf_counter() - t0)
    vals = {"universal": float(lower_bound(g, cluster, k))}
    vals["chain"] = chain_bound(g, it, cluster, k)
    vals["work chain"] = work_chain_bound(g, it, k)
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
    vals = {key: float(v) for key, v in vals.items()}
    name = max(vals, key=lambda x: vals[x])
    return BoundReport(vals[name], name, vals, time.perf_counter() - t0)
