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
    P = max(2, opts.population)
    n_el = max(1, int(round(opts.elite * P)))
    n_mu = max(0, min(P - n_el, int(round(opts.mutants * P))))
    decode = _Decoder(g, cluster, opts, sequences, on_improve, t0)
    keys = _first_keys(g, rng, P, seeds)
    population = _Population(keys, np.array([decode(ind) for ind in keys]))
    done = 0  # generations started before the time limit
    for gen in range(1, opts.generations + 1):
        if decode.timed_out or time.perf_counter() - t0 > opts.time_limit:
            break
        done = gen
        population = _next_generation(population, rng, n_el, n_mu, opts.bias, decode)
    stats = {
        "decodes": decode.decodes,
        "generations": done,
        "seconds": round(time.perf_counter() - t0, 3),
        "time_limit_reached": decode.timed_out,
    }
    if decode.best_devices is not None:
        stats["devices"] = decode.best_devices
    return decode.best_value, decode.best_assignment, stats


class _Decoder:
    """The fitness of a vector of random keys: its priority order sliced optimally (against
    each device sequence, the best kept); remembers the best slicing seen. A decode that the
    time limit would cut (by the average so far), or any after one was cut, is inf."""

    def __init__(
        self,
        g: Graph,
        cluster: Cluster,
        opts: BrkgaOptions,
        sequences: list[np.ndarray] | None,
        on_improve,
        t0: float,
    ):
        self.g, self.cluster, self.time_limit = g, cluster, opts.time_limit
        self.sequences = [None] if sequences is None else sequences
        self.on_improve, self.t0 = on_improve, t0
        self.deadline = t0 + opts.time_limit
        self.best_value = math.inf
        self.best_assignment: np.ndarray | None = None
        self.best_devices: list[int] | None = None
        self.decodes = 0
        self.timed_out = False

    def __call__(self, keys: np.ndarray) -> float:
        elapsed = time.perf_counter() - self.t0
        if self.timed_out or (
            self.decodes >= 1 and elapsed * (self.decodes + 1) / self.decodes > self.time_limit
        ):
            return math.inf  # another decode would overrun: leave the rest unevaluated
        self.decodes += 1
        upper = 2 * self.best_value if math.isfinite(self.best_value) else math.inf
        order = priority_order(self.g, keys)
        val, a, dev = math.inf, None, None
        try:
            for seq in self.sequences:
                v, b = slice_order(
                    self.g, self.cluster, order, upper=upper, deadline=self.deadline, devices=seq
                )
                if b is not None and v < val:
                    val, a, dev = v, b, seq
        except SliceTimeout:
            self.timed_out = True
            return math.inf
        if a is not None and val < self.best_value:
            self.best_value, self.best_assignment = val, a
            self.best_devices = None if dev is None else [int(d) for d in dev]
            if self.on_improve is not None:
                self.on_improve(self.best_value, time.perf_counter() - self.t0)
        return val


@dataclass
class _Population:
    """One row of random keys per individual, and each one's fitness (bottleneck cost)."""

    keys: np.ndarray
    fitness: np.ndarray


def _first_keys(g: Graph, rng: np.random.Generator, P: int, seeds) -> np.ndarray:
    """P random key vectors; the first ones encode the ``seeds`` orders (keys = positions)."""
    pop = rng.random((P, g.n))
    for i, order in enumerate(list(seeds)[:P]):
        keys = np.empty(g.n)
        keys[order] = np.arange(g.n) / g.n
        pop[i] = keys
    return pop


def _next_generation(
    population: _Population,
    rng: np.random.Generator,
    n_el: int,
    n_mu: int,
    bias: float,
    decode: _Decoder,
) -> _Population:
    """Elites survive, mutants are fresh random vectors, the rest are crossovers taking each
    key from an elite parent with probability ``bias`` (the other parent from the rest)."""
    pop, fit = population.keys, population.fitness
    P, n = pop.shape
    rank = np.argsort(fit, kind="stable")
    elite, rest = pop[rank[:n_el]], pop[rank[n_el:]]
    n_x = P - n_el - n_mu
    pa = elite[rng.integers(0, n_el, n_x)]
    pb = rest[rng.integers(0, len(rest), n_x)] if len(rest) else elite[rng.integers(0, n_el, n_x)]
    mask = rng.random((n_x, n)) < bias
    kids = np.where(mask, pa, pb)
    mut = rng.random((n_mu, n))
    new = np.concatenate([kids, mut])
    return _Population(
        np.concatenate([elite, new]),
        np.concatenate([fit[rank[:n_el]], [decode(ind) for ind in new]]),
    )
