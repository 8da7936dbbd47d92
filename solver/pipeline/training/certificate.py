"""The certificate of a training plan: every proven lower bound on its iteration time T, named.

:func:`certified_training_bound` is the bound that holds for every plan of at most k blocks,
with no search: :func:`solver.core.training.training_lower_bound` with the certified bottleneck
bound of :mod:`solver.pipeline.bounds` as the floor of its max term (max t_i >= max f_i).
``mtpp solve`` adds the exact methods' bounds to it; ``mtpp evaluate`` re-certifies a plan file
with it alone (docs/training.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from solver.core.cluster import Cluster
from solver.core.graph import Graph
from solver.core.training import TrainingSpec, training_lower_bound
from solver.pipeline.bounds import certified_lower_bound, topology

BOUND_SHARE = 0.15  # of the time limit for the certified bottleneck bound (as registry's)
BOUND_MAX_SECONDS = 10.0
ANALYTIC = "training average/neighbourhood bound"  # the name of the analytic bound


@dataclass
class Certificate:
    """Every proven lower bound on T (name -> seconds), the rounding resolution of an exact
    model's proof that covers the final plan (0: none), and notes on what did not run."""

    bounds: dict[str, float] = field(default_factory=dict)
    resolution: float = 0.0
    notes: dict[str, str] = field(default_factory=dict)
    infeasible: bool = False  # proven: no plan fits the memory

    @property
    def binding(self) -> str:
        return max(self.bounds, key=lambda name: self.bounds[name])

    @property
    def value(self) -> float:
        return max(self.bounds.values(), default=0.0)


def certified_training_bound(
    g: Graph, cluster: Cluster, k: int, spec: TrainingSpec, seconds: float
) -> Certificate:
    """A bound on T of every plan of at most k blocks: the analytic bound on T with the
    certified bottleneck bound (``seconds`` for it) as its max-term floor. That bound speaks
    of plans whose blocks fit params + peak <= C, which every valid training plan meets when
    the state factor is >= 1; below 1 it is not used."""
    cert = Certificate()
    max_f = 0.0
    if spec.optimizer_state >= 1:
        rep = (
            certified_lower_bound(g, cluster, time_limit=seconds)
            if cluster.homogeneous
            else topology.topology_bound(g, cluster, seconds)
        )
        if rep.infeasible:
            cert.infeasible = True
            cert.notes["bottleneck bound"] = "no block of any plan fits params + peak"
            return cert
        max_f = rep.value
        cert.notes["bottleneck bound"] = f"{rep.binding}: max f >= {rep.value:.6g} s"
    else:
        cert.notes["bottleneck bound"] = "not used: the state factor is below 1"
    cert.bounds[ANALYTIC] = training_lower_bound(g, cluster, k, spec, max_f_bound=max_f)
    return cert
