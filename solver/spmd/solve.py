"""One library call for every sharding method: model, mesh, method, memory limit -> a checked plan.

``solve_sharding(model, devices=8, method="cpsat", memory="400MB")`` returns a
:class:`ShardResult` (spmd/plan.py): the strategies, the program as :func:`evaluate` prices it,
a status certified by :func:`solver.core.result.certify`, and a lower bound every plan's time is
at least (proven by CP-SAT for ``cpsat``, spmd/search.py; the sum of each operator's least
compute for the heuristics). A memory limit no plan can meet, or a heuristic plan over it,
raises :class:`MtppError` naming the memory needed.
"""

from __future__ import annotations

import math
import time

from solver.core.cluster import Cluster, load_cluster
from solver.core.cluster_views import lockstep
from solver.core.errors import MtppError
from solver.core.options import check_spmd_options
from solver.core.result import certify
from solver.core.units import parse_memory
from solver.spmd.mesh import make_mesh, parse_mesh
from solver.spmd.model import ShardModel, load_model
from solver.spmd.plan import (
    SearchOptions,
    ShardResult,
    check_method,
    compute_bound,
    describe_memory,
    fits,
    fmt_limit,
    heuristic,
    load_pins,
)
from solver.spmd.program import Planner, evaluate
from solver.spmd.training import TrainingSpec, choose_gradient_sync

__all__ = ["exact_search", "solve_sharding"]


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
    training: TrainingSpec | None = None,
    weights: bool = True,
) -> ShardResult:
    """Shard ``model`` (an ONNX path or a loaded :class:`ShardModel`) with ``method``.

    ``mesh``: "2x4" or a tuple (default one axis of ``devices``); ``memory``: bytes or a size
    such as "16GiB" (default: the cluster's capacity); ``config``: a strategy YAML path or a
    dict of node name -> strategy, fixed in every method; ``cluster``: a preset, a YAML path or
    a :class:`Cluster` (devices that differ: priced at the slowest compute, within the least
    capacity); ``progress``: a :class:`solver.cli.progress.SolveProgress` or None. ``cpsat``
    returns within about ``time_limit`` (plus the first heuristic plan and one evaluation):
    past it, the best warm start with its bound, FEASIBLE, and ``stats["stopped"]``; when no
    plan that fits was found by then, up to search.MEMORY_BOUND_SHARE of it more looks for the
    leanest plan (returned when it fits) and the least memory any plan needs (the refusal).
    ``training``: plan a training step instead of inference (backward, gradient
    synchronisation, training memory; docs/training.md), None for inference. ``weights``:
    read the model's external weights (False: those over 1 MiB stay on disk, planned from
    their shape; a plan that is only priced needs no values).
    """
    check_method(method)
    check_spmd_options(time_limit, workers, seed)
    t0 = time.perf_counter()
    cluster = lockstep(cluster if isinstance(cluster, Cluster) else load_cluster(cluster, devices))
    shape = _mesh_shape(mesh, cluster)
    limit = _memory_limit(memory, cluster)
    sm = model if isinstance(model, ShardModel) else load_model(model, dims or {}, weights=weights)
    planner = Planner(sm, make_mesh(shape, cluster), cluster, training)
    pins = load_pins(planner, config, str(model) if not isinstance(model, ShardModel) else "model")
    bound = compute_bound(planner, pins)
    if method != "cpsat":
        return _with_gradient_sync(_heuristic_result(planner, method, pins, limit, bound, t0))
    opts = SearchOptions(time_limit, workers, seed, progress, log, encoding)
    return _with_gradient_sync(exact_search(planner, pins, limit, bound, t0, opts))


def exact_search(
    planner: Planner, pins: dict, limit: float | None, bound: float, t0: float, opts: SearchOptions
) -> ShardResult:
    """The exact search of spmd/search.py on a planner the caller built (the joint training
    planner's intervals: a segment's gradient flow, a sync weight), without the choice of
    AllReduce or ZeRO-1 that :func:`solve_sharding` adds."""
    from solver.spmd import search  # heavy: ortools (the exact models)

    return search.exact_search(planner, pins, limit, bound, t0, opts)


def _with_gradient_sync(res: ShardResult) -> ShardResult:
    """In training: AllReduce for every weight gradient where the plan fits without ZeRO-1,
    ZeRO-1 only for the weights the limit needs (the time is the same)."""
    if res.program.training is not None:
        res.program = choose_gradient_sync(res.planner, res.program, res.memory_limit)
    return res


def _mesh_shape(mesh, cluster: Cluster) -> tuple[int, ...]:
    shape = parse_mesh(mesh, cluster.devices) if not isinstance(mesh, tuple) else mesh
    if math.prod(shape) != cluster.devices:
        raise MtppError(f"mesh {shape} does not multiply to the {cluster.devices} devices")
    return shape


def _memory_limit(memory, cluster: Cluster) -> float | None:
    limit = cluster.capacity if memory is None else parse_memory(memory)
    if limit is not None and not math.isfinite(limit):
        limit = None
    return limit


def _heuristic_result(planner, method: str, pins, limit, bound: float, t0: float) -> ShardResult:
    """One heuristic plan, FEASIBLE with the least-compute bound; refused over the limit."""
    strategies = heuristic(planner, method, pins)
    program = evaluate(planner, strategies)
    if not fits(program, limit):
        raise MtppError(
            f"the {method} plan needs {describe_memory(program)} but the memory limit is "
            f"{fmt_limit(limit)}; raise --memory or use --method cpsat"
        )
    verdict = certify(method, program.objective, [bound], proven=False)
    return ShardResult(
        method,
        verdict.status,
        strategies,
        program,
        planner,
        pins,
        limit,
        verdict.lower_bound,
        time.perf_counter() - t0,
        {"bound": "least compute per operator"},
    )
