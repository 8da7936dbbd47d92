"""One library call for every sharding method: model, mesh, method, memory limit -> a checked plan.

``solve_sharding(model, devices=8, method="cpsat", memory="400MB")`` returns a
:class:`ShardResult`: the strategies, the program as :func:`evaluate` prices it, a status from
solver/pipeline/plan.py, and a lower bound every plan's time is at least (proven by CP-SAT for
``cpsat``;
the sum of each operator's least compute for the heuristics). A memory limit no plan can meet,
or a heuristic plan over it, raises :class:`MtppError` naming the memory needed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from solver.core.errors import MtppError
from solver.spmd.program import Planner, Program, evaluate
from solver.spmd.rules import Strategy

METHODS = {
    "propagate": "sharding propagation (MindSpore, seed 002) from the configured operators",
    "dp": "data parallel: every operator splits its batch dim over all devices when it can",
    "megatron": "Megatron-LM: weight MatMuls alternate column and row splits, then propagation",
    "cpsat": "exact: CP-SAT over every strategy of every operator, warm-started by the others",
}
LAGRANGE_SHARE = 0.92  # share of the time limit the Lagrangian bound and mixing may take
WINDOW_GAP = 0.01  # exact window solves start only when the best plan is this far from the bound
WINDOW_SHARE = 0.8  # share of the time left after the bounds the window solves may take
MEMORY_BOUND_SHARE = 0.25  # share of the time limit spent bounding an impossible memory limit


@dataclass
class ShardResult:
    """A sharding plan with its cost, status and a lower bound on every plan's time."""

    method: str
    status: str
    strategies: dict[str, Strategy]
    program: Program
    planner: Planner
    configured: dict[str, Strategy]
    memory_limit: float | None
    lower_bound: float | None
    wall_seconds: float
    stats: dict = field(default_factory=dict)

    @property
    def objective(self) -> float:
        return self.program.objective

    @property
    def gap(self) -> float | None:
        """(objective - bound) / objective, None without a bound."""
        from solver.pipeline.plan import relative_gap

        return relative_gap(self.objective, self.lower_bound)


def check_options(time_limit: float, workers: int, seed: int) -> None:
    """Refuse a time limit, worker count or seed CP-SAT cannot take (its seed is 32-bit)."""
    from solver.pipeline.registry import MAX_SEED, MAX_WORKERS

    if not math.isfinite(time_limit) or time_limit <= 0:
        raise MtppError(f"--time-limit must be a positive number of seconds, got {time_limit}")
    if not 0 <= workers <= MAX_WORKERS:
        raise MtppError(f"--workers must be >= 0 and at most {MAX_WORKERS}, got {workers}")
    if not 0 <= seed <= MAX_SEED:
        raise MtppError(f"--seed must be >= 0 and at most {MAX_SEED}, got {seed}")


def compute_bound(planner: Planner, pins: dict[str, Strategy]) -> float:
    """Sum over operators of their least compute (communication is never negative)."""
    total = 0.0
    for i, op in enumerate(planner.sm.ops):
        if op.name in pins:
            total += planner.compute_time(i, planner.sharding(i, pins[op.name]))
        else:
            total += min(planner.compute_time(i, sh) for sh in planner.candidates(i))
    return total


def heuristic(planner: Planner, method: str, pins: dict[str, Strategy]) -> dict[str, Strategy]:
    """The strategies of one heuristic method (pins kept)."""
    from solver.spmd.patterns import data_parallel_plan, megatron_plan
    from solver.spmd.propagate import propagate

    if method == "propagate":
        return propagate(planner, pins)
    if method == "dp":
        return data_parallel_plan(planner, pins)
    if method == "megatron":
        return megatron_plan(planner, pins)
    raise MtppError(f"unknown sharding method {method!r}; use one of {', '.join(METHODS)}")


def describe_memory(program: Program) -> str:
    from solver.core.units import format_bytes

    return (
        f"{format_bytes(program.memory_per_device)} per device (weights "
        f"{format_bytes(program.weight_memory)} + activation peak "
        f"{format_bytes(program.peak_activation_memory)})"
    )


def fits(program: Program, limit: float | None) -> bool:
    return limit is None or program.memory_per_device <= limit


def load_pins(planner: Planner, config, where: str) -> dict[str, Strategy]:
    """The model's annotations, then ``config`` (a YAML path or a dict), each checked."""
    from solver.spmd.config import from_attributes, parse_strategy, read_config

    sm = planner.sm
    pins = from_attributes(sm)
    if isinstance(config, (str, Path)):
        pins.update(read_config(config, sm))
        where = str(config)
    elif config:
        for name, value in config.items():
            if sm.op_by_name(name) is None:
                raise MtppError(f"{where}: no node named {name!r} in the model")
            pins[name] = parse_strategy(value, f"node {name!r}")
    for name, strategy in pins.items():
        try:
            planner.sharding(sm.op_by_name(name).index, strategy)
        except MtppError as e:
            raise MtppError(f"{where}: {e}") from None
    return pins


def solve_sharding(
    model,
    devices: int | None = None,
    mesh=None,
    method: str = "cpsat",
    memory=None,
    config=None,
    time_limit: float = 60.0,
    *,
    cluster=None,
    dims: dict[str, int] | None = None,
    workers: int = 0,
    seed: int = 0,
    progress=None,
    log: bool = False,
    encoding: str = "cuts",
) -> ShardResult:
    """Shard ``model`` (an ONNX path or a loaded :class:`ShardModel`) with ``method``.

    ``mesh``: "2x4" or a tuple (default one axis of ``devices``); ``memory``: bytes or a size
    such as "16GiB" (default: the cluster's capacity); ``config``: a strategy YAML path or a
    dict of node name -> strategy, fixed in every method; ``cluster``: a preset, a YAML path or
    a :class:`Cluster` (devices that differ: priced at the slowest compute, within the least
    capacity); ``progress``: a :class:`solver.cli.progress.SolveProgress` or None. ``cpsat``
    returns within about ``time_limit`` (plus the first heuristic plan and one evaluation):
    past it, the best warm start with its bound, FEASIBLE, and ``stats["stopped"]``; when no
    plan that fits was found by then, up to MEMORY_BOUND_SHARE of it more looks for the
    leanest plan (returned when it fits) and the least memory any plan needs (the refusal).
    """
    from solver.core.cluster import Cluster, load_cluster
    from solver.core.cluster_views import lockstep
    from solver.core.units import parse_memory
    from solver.spmd.mesh import make_mesh, parse_mesh
    from solver.spmd.model import ShardModel, load_model

    if method not in METHODS:
        raise MtppError(f"unknown sharding method {method!r}; use one of {', '.join(METHODS)}")
    check_options(time_limit, workers, seed)
    t0 = time.perf_counter()
    if not isinstance(cluster, Cluster):
        cluster = load_cluster(cluster, devices)
    cluster = lockstep(cluster)  # one SPMD program: the slowest compute, the least capacity
    shape = parse_mesh(mesh, cluster.devices) if not isinstance(mesh, tuple) else mesh
    if math.prod(shape) != cluster.devices:
        raise MtppError(f"mesh {shape} does not multiply to the {cluster.devices} devices")
    limit = cluster.capacity if memory is None else parse_memory(memory)
    if limit is not None and not math.isfinite(limit):
        limit = None
    sm = model if isinstance(model, ShardModel) else load_model(model, dims or {})
    planner = Planner(sm, make_mesh(shape, cluster), cluster)
    where = str(model) if not isinstance(model, ShardModel) else "model"
    pins = load_pins(planner, config, where)
    bound = compute_bound(planner, pins)
    if method != "cpsat":
        strategies = heuristic(planner, method, pins)
        program = evaluate(planner, strategies)
        if not fits(program, limit):
            raise MtppError(
                f"the {method} plan needs {describe_memory(program)} but the memory limit is "
                f"{_fmt(limit)}; raise --memory or use --method cpsat"
            )
        from solver.pipeline.plan import FEASIBLE

        return ShardResult(
            method,
            FEASIBLE,
            strategies,
            program,
            planner,
            pins,
            limit,
            min(bound, program.objective),
            time.perf_counter() - t0,
            {"bound": "least compute per operator"},
        )
    return _exact(
        planner, pins, limit, bound, time_limit, t0, workers, seed, progress, log, encoding
    )


def _fmt(limit: float | None) -> str:
    from solver.core.units import format_bytes

    return "none" if limit is None else f"{format_bytes(limit)} ({limit:.0f} bytes)"


def _exact(planner, pins, limit, bound, time_limit, t0, workers, seed, progress, log, encoding):
    """Warm starts from the heuristics, then CP-SAT; the best plan that fits, its status."""
    from solver.pipeline.plan import (
        FEASIBLE,
        OPTIMAL,
        OPTIMALITY_TOL,
        InvalidBoundError,
        bound_exceeds,
    )
    from solver.spmd.exact import (
        NOT_BUILT,
        ExactOptions,
        ExactResult,
        solve_exact,
    )
    from solver.spmd.lagrange import lagrange

    def note(text: str) -> None:
        if progress is not None:
            progress.note(text)

    deadline = t0 + time_limit

    def left() -> float:
        return deadline - time.perf_counter()

    hints = []
    skipped = []
    order = ("propagate", "dp", "megatron")  # ties go to the first
    for name in ("dp", "propagate", "megatron"):  # the cheapest first
        if hints and left() <= 0:  # one heuristic plan at least, whatever the time
            skipped.append(name)
            continue
        note(f"warm start: {name}")
        s = heuristic(planner, name, pins)
        p = evaluate(planner, s)
        hints.append((p.objective, name, s, p))
    hints.sort(key=lambda h: (h[0], order.index(h[1])))
    lag = None
    if left() > 0:
        note("Lagrangian bound (variable elimination)")
        lag = lagrange(planner, limit, pins, LAGRANGE_SHARE * left())
    lag_stats = {}
    if lag is not None and "least_memory_bound" in lag.stats:  # no plan fits the limit
        raise _refusal(planner, pins, limit, max(1.0, left()), workers)
    if lag is not None:
        bound = max(bound, lag.lower_bound)
        lag_stats = {**lag.stats, "lagrange_lower_bound": lag.lower_bound}
        if lag.strategies is not None:
            hints.append(
                (lag.objective, "lagrange", lag.strategies, evaluate(planner, lag.strategies))
            )
    hints.sort(key=lambda h: (h[0], h[1] not in order))
    if skipped:
        lag_stats["skipped_warm_starts"] = skipped
    fitting = [h for h in hints if fits(h[3], limit)]
    if fitting and limit is not None and fitting[0][0] - bound > WINDOW_GAP * fitting[0][0]:
        note("exact windows over the repeating layers")
        found = _windows(planner, pins, limit, fitting[0][2], WINDOW_SHARE * left(), workers)
        if found.improved:
            lag_stats["window_improvements"] = found.improved
            fitting.insert(0, (found.program.objective, "windows", found.strategies, found.program))
            hints.append(fitting[0])
    if progress is not None and fitting:
        progress.update(fitting[0][0], bound, time.perf_counter() - t0)
    if fitting and fitting[0][0] - bound <= OPTIMALITY_TOL * fitting[0][0]:
        # the Lagrangian bound already proves the best plan optimal: no search needed
        objective, name, strategies, program = fitting[0]
        proof = f"{lag_stats.get('binding_bound', 'lagrangian')} bound"
        if bound_exceeds(bound, objective):
            raise InvalidBoundError(
                f"the {proof} {bound!r} is above the re-evaluated objective "
                f"{objective!r}: a solver bug"
            )
        stats = {**lag_stats, "proof": proof, "kept_warm_start": name}
        stats["warm_starts"] = {h[1]: h[0] if fits(h[3], limit) else None for h in hints}
        stats["raw_lower_bound"] = bound
        return ShardResult(
            "cpsat",
            OPTIMAL,
            strategies,
            program,
            planner,
            pins,
            limit,
            min(bound, objective),
            time.perf_counter() - t0,
            stats,
        )
    note("building the CP-SAT model")
    opts = ExactOptions(
        time_limit=max(0.0, left()),
        workers=workers,
        seed=seed,
        log=log,
        encoding=encoding,
        on_progress=progress.update if progress is not None else None,
    )
    upper = fitting[0][0] if fitting else None
    if opts.time_limit > 0:
        res = solve_exact(planner, limit, pins, [h[2] for h in fitting], opts, upper)
    else:
        why = "the time limit passed before the CP-SAT model was built"
        res = ExactResult(None, -math.inf, NOT_BUILT, {"cpsat_status": NOT_BUILT, "note": why})
    stats = {**res.stats, **lag_stats}
    if res.cpsat_status == NOT_BUILT:
        stats["stopped"] = (
            f"time limit ({time_limit:g} s) reached before CP-SAT ran: the best warm start is "
            f"kept, with the {lag_stats.get('binding_bound', 'least compute')} bound"
        )
    stats["warm_starts"] = {h[1]: h[0] if fits(h[3], limit) else None for h in hints}
    if res.cpsat_status == "INFEASIBLE":
        raise _refusal(planner, pins, limit, max(1.0, left()), workers)
    best = fitting[0] if fitting else None
    if best is not None:
        stats["kept_warm_start"] = best[1]
    lb = bound
    for attempt in range(2):
        lb = max(lb, res.lower_bound)
        if res.strategies is not None:
            p = evaluate(planner, res.strategies)
            if not fits(p, limit):  # bytes are rounded down in the model: not kept
                stats["cpsat_plan_over_limit"] = p.memory_per_device
            elif best is None or p.objective < best[0]:
                best = (p.objective, "cpsat", res.strategies, p)
                stats.pop("kept_warm_start", None)
        if best is None:
            break
        gap = (best[0] - lb) / best[0] if best[0] > 0 else 0.0
        rest = left()
        rounding = res.cpsat_status == "OPTIMAL" and gap > OPTIMALITY_TOL
        if attempt or not rounding or rest < 1.0 or (upper is not None and best[0] >= upper):
            break
        # proven in the integer model but the rounding of a coarse scale leaves a gap: solve
        # again with the plan found as the upper bound, which caps the coefficients (finer S)
        opts.time_limit = rest
        upper = best[0]
        res = solve_exact(planner, limit, pins, [best[2]], opts, upper)
        stats["resolved_with_upper_bound"] = upper
    if best is None:
        # past the time limit: the leanest plan, when it fits, beats no plan at all
        lean = _least_memory(planner, pins, max(1.0, MEMORY_BOUND_SHARE * time_limit), workers)
        if lean is None or lean.strategies is None or lean.upper > limit:
            raise _refusal(planner, pins, limit, 0.0, workers, lean, time_limit)
        program = evaluate(planner, lean.strategies)
        best = (program.objective, "least memory", lean.strategies, program)
        stats["kept_warm_start"] = "least memory"
    objective, _, strategies, program = best
    if bound_exceeds(lb, objective):
        raise InvalidBoundError(
            f"cpsat claims the lower bound {lb!r} above its plan's re-evaluated objective "
            f"{objective!r}: a solver bug"
        )
    stats["raw_lower_bound"] = lb
    lb = min(lb, objective)
    gap = (objective - lb) / objective if objective > 0 else 0.0
    status = OPTIMAL if res.cpsat_status == "OPTIMAL" and gap <= OPTIMALITY_TOL else FEASIBLE
    return ShardResult(
        "cpsat",
        status,
        strategies,
        program,
        planner,
        pins,
        limit,
        lb,
        time.perf_counter() - t0,
        stats,
    )


def _windows(planner, pins, limit: float, start: dict, seconds: float, workers: int):
    """Exact CP-SAT windows over the repeating layers (windows.py) from ``start``."""
    from solver.spmd.windows import window_search

    return window_search(planner, limit, pins, start, time.perf_counter() + seconds, workers)


def _least_memory(planner, pins, seconds: float, workers: int):
    """The least memory per device any plan needs (a LeastMemory, or None): variable
    elimination's interval, narrowed by CP-SAT's memory model in the time left when open."""
    from solver.spmd.exact import LeastMemory, min_memory
    from solver.spmd.lagrange import least_memory_plan

    t0 = time.perf_counter()
    lean = least_memory_plan(planner, pins, seconds)
    rest = seconds - (time.perf_counter() - t0)
    if (lean is not None and lean.exact) or rest <= 0:
        return lean
    cp = min_memory(planner, pins, rest, workers)
    if lean is None or cp.upper < lean.upper:
        lean = LeastMemory(lean.lower if lean else 0.0, cp.upper, cp.strategies)
    return LeastMemory(max(lean.lower, cp.lower), lean.upper, lean.strategies)


def _refusal(
    planner, pins, limit: float, seconds: float, workers: int, lean=None, time_limit=None
) -> MtppError:
    """The one-line refusal of a memory limit no plan is known to meet (proven when
    ``time_limit`` is None), with the least memory any plan needs: exact when proven, else the
    interval from what every plan needs to what the leanest plan found needs."""
    if lean is None and seconds > 0:
        lean = _least_memory(planner, pins, seconds, workers)
    proven = time_limit is None or (lean is not None and lean.lower > limit)
    least = ""
    if lean is not None and lean.exact:
        least = f"; the least memory any plan needs is {_fmt(lean.upper)}"
    elif lean is not None:
        if lean.lower > limit or not proven:
            least = f"; every plan needs at least {_fmt_floor(lean.lower)}"
        else:
            least = f"; every plan needs more than {_fmt(limit)}"
        if math.isfinite(lean.upper):
            least += f" and a plan with {_fmt(lean.upper)} exists"
    if proven:
        return MtppError(
            f"no sharding plan fits the memory limit of {_fmt(limit)} per device{least}; "
            "raise --memory"
        )
    return MtppError(
        f"no plan that fits {_fmt(limit)} per device found within the time limit "
        f"({time_limit:g} s){least}; raise --time-limit or --memory"
    )


def _fmt_floor(nbytes: float) -> str:
    """Bytes rounded down (a lower bound stays one)."""
    return _fmt(float(math.floor(nbytes)))
