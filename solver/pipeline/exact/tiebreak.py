"""Among plans no worse than the exact solver's, the cheapest cuts (issue 11 item 4).

Plans with the same bottleneck can differ a lot in what they send: cutting a decoder mid-layer
sends 4-16 MiB per boundary where the residual stream is 1-2 MiB. After CP-SAT's first stage
(minimise the bottleneck T), two more stages reuse the same model with ``T`` capped at the
first stage's value, each warm-started from the best plan so far:

1. minimise the transferred bytes (every tensor counted once per block that receives it,
   which is what crosses the links: ``Evaluation.bytes_in`` summed; tensors whose transfer
   time rounds to 0 integer units have no variable and are not counted);
2. with the transfer capped at the best found, minimise the latency (the sum of block costs).

Honesty: the bottleneck, its proven bound and its status are the first stage's. The cap is in
rounded-down integer units, so a plan the model accepts may be a rounding error worse in real
numbers: every candidate is re-evaluated by :func:`solver.core.cost.evaluate` and kept only when
its objective is at most the first stage's (exactly), it fits the device capacity, and it
sends less (or as much, with lower latency). The tie-break is a primal search only: it
proves nothing and claims nothing.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from solver.core.cluster import Cluster
from solver.core.cost import evaluate, validate
from solver.core.graph import Graph
from solver.core.sat import MAX_COEF, new_solver
from solver.core.units import format_bytes, format_time

TIE_BREAK_SHARE = 0.2  # at most this share of the time left goes to the tie-break ...
TIE_BREAK_MAIN_SHARE = 0.5  # ... and at most this share of the main solve's seconds ...
TIE_BREAK_MIN_SECONDS = 0.1  # ... or this, when the main solve was faster


@dataclass
class Candidate:
    """A plan of the original graph with the three numbers the stages compare."""

    assignment: np.ndarray
    objective: float
    transfer: float  # bytes received over all blocks
    latency: float

    def better_than(self, other: Candidate) -> bool:
        """Less transfer, or equal transfer and lower latency."""
        return (self.transfer, self.latency) < (other.transfer, other.latency)


def candidate(g: Graph, cluster: Cluster, a: np.ndarray) -> Candidate:
    ev = evaluate(g, cluster, a)
    return Candidate(np.asarray(a), ev.objective, float(ev.bytes_in.sum()), ev.latency)


class _Best:
    """The best acceptable plan read so far: valid, with a bottleneck no higher than
    ``first``'s, and better (:meth:`Candidate.better_than`)."""

    def __init__(self, model, g: Graph, labels: np.ndarray, cluster: Cluster, first: Candidate):
        self.model, self.g, self.labels, self.cluster = model, g, labels, cluster
        self.first = self.plan = first

    def accept(self, value) -> None:
        """Read a solution (``value(var)``), re-evaluate it and keep it when acceptable."""
        ca = self.model.read_values(value)
        c = candidate(self.g, self.cluster, ca[self.labels])
        ok = c.objective <= self.first.objective and c.better_than(self.plan)
        if ok and not validate(self.g, self.cluster, c.assignment):
            self.plan = c


class _Collect(cp_model.CpSolverSolutionCallback):
    """Hands every solution to ``accept``."""

    def __init__(self, accept):
        super().__init__()
        self.accept = accept

    def on_solution_callback(self) -> None:
        self.accept(self.Value)


@dataclass
class _Transfer:
    """The transfer objective: every receive variable of the model (``recv``: ((tensor,
    block), variable) pairs) weighted by its tensor's size in units (``coef``), as ``expr``."""

    recv: list
    coef: np.ndarray
    expr: object


def _transfer_objective(model) -> _Transfer:
    """Received bytes in units of 2^j bytes (the coefficients stay below MAX_COEF)."""
    recv = list(model.recv.items())
    size = np.array([model.g.t_size[t] for (t, _), _ in recv], dtype=float)
    unit = 2.0 ** max(0, math.ceil(math.log2(max(float(size.max(initial=1.0)), 1.0) / MAX_COEF)))
    coef = np.maximum(1, np.round(size / unit)).astype(np.int64)
    return _Transfer(
        recv, coef, cp_model.LinearExpr.WeightedSum([v for _, v in recv], coef.tolist())
    )


def tie_break_budget(left: float, main_seconds: float, asked: float | None = None) -> float:
    """Seconds for the tie-break: ``asked`` (the user's ``tie_break_seconds``) within the
    ``left`` seconds of the limit; by default at most TIE_BREAK_SHARE of them and at most
    half as long as the main solve took (``main_seconds``: bounds, warm start, model and
    search; at least TIE_BREAK_MIN_SECONDS), so a fast solve stays fast."""
    if asked is not None:
        return max(0.0, min(left, asked))
    own = max(TIE_BREAK_MIN_SECONDS, TIE_BREAK_MAIN_SHARE * main_seconds)
    return max(0.0, min(TIE_BREAK_SHARE * left, own))


def tie_break(
    model,
    g: Graph,
    labels: np.ndarray,
    cluster: Cluster,
    coarse_a: np.ndarray,
    seconds: float,
    params: dict,
) -> tuple[np.ndarray, dict]:
    """Improve the transfer, then the latency, of the first stage's plan ``coarse_a`` (on the
    coarse graph of ``model``) without raising its bottleneck. Returns the plan on the
    original graph and the stats to report (``summary`` is one line for people)."""
    t0 = time.perf_counter()
    first = candidate(g, cluster, coarse_a[labels])
    best = _Best(model, g, labels, cluster, first)
    # every plan whose real bottleneck is at most the first stage's has an integer cost at
    # most floor(S * objective) (each term rounded down); a few above are filtered by _Best
    t_cap = max(int(model.block_costs_int(coarse_a).max()), math.floor(model.S * first.objective))
    model.m.Add(t_cap >= model.T)
    transfer = _transfer_objective(model)
    stages = []
    for stage in ("transfer", "latency"):
        left = seconds - (time.perf_counter() - t0)
        if left <= 0.01 or (stage == "transfer" and not transfer.recv):
            continue
        status_name = _run_stage(model, labels, stage, transfer, best, left, params)
        stages.append(f"{stage} {status_name}")
    final = best.plan
    # the tie-break never worsens the bottleneck: the evaluator says so, not the model
    assert final.objective <= first.objective, "tie-break raised the bottleneck"
    spent = time.perf_counter() - t0
    stats = {
        "order": "bottleneck, then transferred bytes, then latency",
        "stages": stages,
        "seconds": round(spent, 3),
        "budget_seconds": round(seconds, 3),
        "transfer_bytes_before": first.transfer,
        "transfer_bytes_after": final.transfer,
        "latency_before": first.latency,
        "latency_after": final.latency,
        "summary": _summary(first, final, stages, spent),
    }
    return final.assignment, stats


def _run_stage(
    model,
    labels: np.ndarray,
    stage: str,
    transfer: _Transfer,
    best: _Best,
    left: float,
    params: dict,
) -> str:
    """One stage on the model, hinted with the best plan so far: least transfer (2/3 of the
    time ``left``: the latency stage gets the rest, more if this one proves), or, with the
    transfer capped at the best plan's, least latency (the sum of the block costs). Returns
    CP-SAT's status name."""
    m = model.m
    m.ClearObjective()
    m.ClearHints()
    if stage == "transfer":
        m.Minimize(transfer.expr)
        limit = left * 2 / 3
    else:
        cap = _transfer_int(model, best.plan.assignment, labels, transfer.coef, transfer.recv)
        m.Add(transfer.expr <= cap)
        m.Minimize(sum(_block_sum(model, b) for b in range(model.k)))
        limit = left
    model.add_hint(_coarse(best.plan.assignment, labels, model.g.n))
    solver = new_solver(max(0.01, limit), params)
    status = solver.Solve(m, _Collect(best.accept))
    return solver.StatusName(status)


def _summary(first: Candidate, final: Candidate, stages: list[str], seconds: float) -> str:
    """One line for people; "proven" only when the transfer stage proved its optimum, and when
    it did not, what the stop left: the transfer found, not proven least."""
    proven = bool(stages) and stages[0] == "transfer OPTIMAL"
    if final is first or not final.better_than(first):
        if proven:
            return (
                "tie-break: proven: no plan with the same bottleneck that sends less than "
                f"{format_bytes(first.transfer)} (latency {format_time(first.latency)})"
            )
        return (
            "tie-break: found in time no plan with the same bottleneck that sends less than "
            f"{format_bytes(first.transfer)} (latency {format_time(first.latency)}); stopped "
            f"after {seconds:.2f} s: transfer <= {format_bytes(first.transfer)}, not proven least"
        )
    change = (
        f"transferred {format_bytes(first.transfer)} -> {format_bytes(final.transfer)}, "
        f"latency {format_time(first.latency)} -> {format_time(final.latency)}"
    )
    if proven:
        return f"tie-break at the same bottleneck: {change} (least transfer proven)"
    return (
        f"tie-break at the same bottleneck: {change}; stopped after {seconds:.2f} s: "
        f"transfer <= {format_bytes(final.transfer)}, not proven least"
    )


def _coarse(a: np.ndarray, labels: np.ndarray, n: int) -> np.ndarray:
    ca = np.empty(n, dtype=np.int64)
    ca[labels] = a
    return ca


def _transfer_int(model, a: np.ndarray, labels: np.ndarray, coef: np.ndarray, recv) -> int:
    """The transfer objective's value for plan ``a`` (original graph), from the same terms."""
    ca = _coarse(a, labels, model.g.n)
    g = model.g
    total = 0
    for ((t, b), _), c in zip(recv, coef.tolist(), strict=True):
        cons = g.t_cons[g.t_ptr[t] : g.t_ptr[t + 1]]
        if ca[g.t_producer[t]] != b and bool(np.any(ca[cons] == b)):
            total += c
    return total


def _block_sum(model, b: int):
    """Block b's modelled cost (work, io and overflow terms) as one expression."""
    terms = model.terms[b]
    if not terms:
        return 0
    coefs, lits = zip(*terms, strict=True)
    return cp_model.LinearExpr.WeightedSum(list(lits), list(coefs))
