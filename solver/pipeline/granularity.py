"""Layer-granular plans: cut only between modules (the repeated blocks and the modules around
them), so that a plan is a ``split_spec`` torch, Megatron, DeepSpeed or vLLM can run.

The restriction is a co-location: every node joins its unit's group
(:class:`solver.frontends.onnx.modules.ModuleLayout`), so every planner and every bound works
unchanged on the restricted graph (its coarse view has one node per unit, or per cycle of units).

The plan also says what the restriction costs. Both problems are solved and certified: the
layer-granular optimum L* and the operator-level optimum O* satisfy O* <= L* (a layer plan is
an operator plan), so the operator-level bound is a bound on L* as well and the layer plan an
upper bound on O*. The price L* - O* is then known to lie in
``[max(0, layer bound - operator objective), layer objective - operator bound]``; both ends are
exact when both plans are proven optimal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from solver.core.cluster import Cluster
from solver.core.graph import Graph
from solver.frontends.onnx.modules import ModuleLayout
from solver.pipeline import registry
from solver.pipeline.options import SolveOptions
from solver.pipeline.plan import Plan, make_plan

GRANULARITY_KEY = "granularity"  # plan.stats key of the layer-granular record


@dataclass(frozen=True)
class RestrictionCost:
    """What cutting only between modules costs, from two certified solves (seconds)."""

    layer_objective: float
    layer_lower_bound: float
    layer_status: str
    operator_objective: float
    operator_lower_bound: float
    operator_status: str
    at_least: float  # the price L* - O* is at least this ...
    at_most: float  # ... and at most this

    def to_dict(self) -> dict:
        return asdict(self)


def restrict_to_layers(g: Graph, layout: ModuleLayout) -> Graph:
    """``g`` with every node co-located with its unit (existing groups kept: units they join
    are merged); names and edges unchanged, so a plan for it is a plan for ``g``."""
    labels = np.asarray(layout.node_unit, dtype=np.int64)
    parent = list(range(len(layout.units)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for members in g.groups:
        first = find(int(labels[members[0]]))
        for v in members[1:]:
            parent[find(int(labels[v]))] = first
    merged = np.array([find(int(u)) for u in labels], dtype=np.int64)
    return replace(g, group=merged)


def restriction_cost(layer: Plan, operator: Plan) -> RestrictionCost:
    """The certified interval of L* - O* from a layer plan and an operator plan (both with
    their bounds; a missing bound counts as 0)."""
    op_obj = min(operator.objective, layer.objective)
    op_lb = operator.lower_bound or 0.0
    layer_lb = max(layer.lower_bound or 0.0, op_lb)
    return RestrictionCost(
        layer_objective=layer.objective,
        layer_lower_bound=layer_lb,
        layer_status=layer.status,
        operator_objective=op_obj,
        operator_lower_bound=op_lb,
        operator_status=operator.status,
        at_least=max(0.0, layer_lb - op_obj),
        at_most=max(0.0, layer.objective - op_lb),
    )


def solve_layer_granular(
    g: Graph,
    layout: ModuleLayout,
    cluster: Cluster,
    method: str,
    opts: SolveOptions | None = None,
) -> Plan | None:
    """The best plan ``method`` finds among those that cut only between units, with
    ``stats["granularity"]`` stating the units, the blocks and the certified price of the
    restriction against the operator-level optimum (solved too, with the same method and
    half the time each). None when no layer-granular plan fits."""
    opts = opts or SolveOptions()
    half = replace(opts, time_limit=opts.time_limit / 2)
    layer = registry.solve(restrict_to_layers(g, layout), cluster, method, half)
    if layer is None:
        return None
    operator = registry.solve(g, cluster, method, half) or layer
    cost = restriction_cost(layer, operator)
    return _with_cost(g, cluster, layer, layout, cost)


def _with_cost(
    g: Graph, cluster: Cluster, layer: Plan, layout: ModuleLayout, cost: RestrictionCost
) -> Plan:
    """The layer plan with the larger certified bound (the operator-level one bounds the
    layer problem too) and the granularity record."""
    stats = dict(layer.stats)
    stats[GRANULARITY_KEY] = {
        "mode": "layer",
        "bound_scope": "plans that cut only between the units",
        "units": list(layout.units),
        "blocks": list(layout.blocks),
        "container": layout.container,
        "restriction_cost": cost.to_dict(),
    }
    return make_plan(
        g,
        cluster,
        layer.assignment,
        layer.method,
        lower_bound=cost.layer_lower_bound,
        status=layer.status,
        wall_seconds=layer.wall_seconds,
        stats=stats,
        check=False,
        resolution=float(layer.stats.get("optimal_within") or 0.0),
        placement=layer.placement,
    )


__all__ = [
    "GRANULARITY_KEY",
    "RestrictionCost",
    "restrict_to_layers",
    "restriction_cost",
    "solve_layer_granular",
]
