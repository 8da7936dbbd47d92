"""SliceGraph's search over topological orders: a biased random-key genetic algorithm.

Each individual is a vector of random keys (one per node), decoded by the priority topological
sort (:func:`~solver.pipeline.heuristics.orders.priority_order`) and sliced optimally
(:func:`~solver.pipeline.heuristics.slicing.slice_order`); fitness is the bottleneck cost. Standard
BRKGA
(Goncalves and Resende): elites survive, mutants are fresh random vectors, the rest are
crossovers taking each key from the elite parent with probability ``bias``.
Archer et al. (ICML 2024) use population 100 x 100 generations ("brkga-10000") or 10 x 10.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from solver.core.cluster import Cluster
from solver.core.graph import Graph
from solver.pipeline.heuristics.orders import priority_order
from solver.pipeline.heuristics.slicing import SliceTimeout, slice_order


@dataclass
class BrkgaOptions:
    population: int = 20
    generations: int = 10
    elite: float = 0.2
    mutants: float = 0.1
    bias: float = 0.7
    seed: int = 0
    time_limit: float = math.inf


def brkga(
    g: Graph,
    cluster: Cluster,
    opts: BrkgaOptions,
    seeds: list[np.ndarray] = (),
    on_improve=None,
    sequences: list[np.ndarray] | None = None,
) -> tuple[float, np.ndarray | None, dict]:
    """Best (bottleneck, assignment) over the decoded orders, and search statistics.

    With ``sequences`` (device sequences of a heterogeneous cluster) every order is sliced
    against each sequence (:func:`~solver.pipeline.heuristics.slicing.slice_order` with ``devices``)
    and the best is kept; the statistics then hold its sequence as ``"devices"``.

    ``seeds`` are orders to inject into the first population (as keys = their positions);
    ``on_improve(best, elapsed)`` is called whenever the best slicing improves. The search
    stops at ``opts.time_limit`` (also in the middle of a decode) and returns its best so far.
    """
    rng = np.random.default_rng(opts.seed)
    t0 = time.perf_counter()
    deadline = t0 + opts.time_limit
    timed_out = False
    P = max(2, opts.population)
    n_el = max(1, int(round(opts.elite * P)))
    n_mu = max(0, min(P - n_el, int(round(opts.mutants * P))))
    pop = rng.random((P, g.n))
    for i, order in enumerate(list(seeds)[:P]):
        keys = np.empty(g.n)
        keys[order] = np.arange(g.n) / g.n
        pop[i] = keys
    best_val, best_a = math.inf, None
    best_dev: list[int] | None = None
    decodes = 0

    def decode(keys: np.ndarray) -> float:
        nonlocal best_val, best_a, best_dev, decodes, timed_out
        elapsed = time.perf_counter() - t0
        if timed_out or (decodes >= 1 and elapsed * (decodes + 1) / decodes > opts.time_limit):
            return math.inf  # another decode would overrun: leave the rest unevaluated
        decodes += 1
        upper = 2 * best_val if math.isfinite(best_val) else math.inf
        order = priority_order(g, keys)
        val, a, dev = math.inf, None, None
        try:
            for seq in [None] if sequences is None else sequences:
                v, b = slice_order(g, cluster, order, upper=upper, deadline=deadline, devices=seq)
                if b is not None and v < val:
                    val, a, dev = v, b, seq
        except SliceTimeout:
            timed_out = True
            return math.inf
        if a is not None and val < best_val:
            best_val, best_a = val, a
            best_dev = None if dev is None else [int(d) for d in dev]
            if on_improve is not None:
                on_improve(best_val, time.perf_counter() - t0)
        return val

    fit = np.array([decode(ind) for ind in pop])
    done = 0  # generations started before the time limit
    for gen in range(1, opts.generations + 1):
        if timed_out or time.perf_counter() - t0 > opts.time_limit:
            break
        done = gen
        rank = np.argsort(fit, kind="stable")
        elite, rest = pop[rank[:n_el]], pop[rank[n_el:]]
        n_x = P - n_el - n_mu
        pa = elite[rng.integers(0, n_el, n_x)]
        pb = (
            rest[rng.integers(0, len(rest), n_x)]
            if len(rest)
            else elite[rng.integers(0, n_el, n_x)]
        )
        mask = rng.random((n_x, g.n)) < opts.bias
        kids = np.where(mask, pa, pb)
        mut = rng.random((n_mu, g.n))
        new = np.concatenate([kids, mut])
        pop = np.concatenate([elite, new])
        fit = np.concatenate([fit[rank[:n_el]], [decode(ind) for ind in new]])
    return (
        best_val,
        best_a,
        {
            "decodes": decodes,
            "generations": done,
            "seconds": round(time.perf_counter() - t0, 3),
            "time_limit_reached": timed_out,
        }
        | ({} if best_dev is None else {"devices": best_dev}),
    )
