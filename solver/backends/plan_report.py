"""A plan's HTML report as records (:class:`solver.backends.report_html.Report`), read from the
plan's JSON content and, where given, its graph and its simulations: :func:`pipeline_report`
(inference and training plans), :func:`joint_report`, :func:`spmd_report`, and the pieces they
share (the stage rows, the bound ladder, the operator sequence, the graph by depth, the
timelines). A value of the plan that is not what mtpp writes is refused with
:class:`MtppError` naming it; nothing here prints or reads files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solver.backends.report_html import (
    Fact,
    Gantt,
    GanttBar,
    GraphEdge,
    GraphNode,
    GraphView,
    Ladder,
    MeshView,
    OperatorRow,
    Part,
    Report,
    Rung,
    SequenceRun,
    StageRow,
    percent,
    shown_bytes,
    shown_time,
)
from solver.backends.schedule import ScheduleRun, simulate_schedule
from solver.core.errors import MtppError
from solver.core.graph import Graph
from solver.core.text import device_ranges
from solver.core.training import TrainingSpec
from solver.core.units import format_time
from solver.joint.plan import JointPlan
from solver.pipeline.plan import read_plan_training

# ---------------------------------------------------------------------- building reports
GRAPH_NODES_DRAWN = 1000  # larger graphs are shown by the sequence strip only


@dataclass(frozen=True)
class GanttRow:
    """A row of a timeline: ``source`` is the row id the simulator uses (block, device)."""

    source: int
    stage: int
    label: str


def number(value: object, what: str) -> float:
    """``value`` as a finite float, or :class:`MtppError` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MtppError(f"{what} is not a finite number ({value!r:.40})")
    return float(value)


def optional_number(value: object) -> float | None:
    """``value`` as a float when it is a finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def sequence_runs(names: list[str], stages: list[int]) -> tuple[SequenceRun, ...]:
    """Consecutive operators of one stage as one run (names in topological order)."""
    runs: list[SequenceRun] = []
    for name, stage in zip(names, stages, strict=True):
        last = runs[-1] if runs else None
        if last is not None and last.stage == stage:
            runs[-1] = SequenceRun(stage, last.count + 1, last.first, name)
        else:
            runs.append(SequenceRun(int(stage), 1, name, name))
    return tuple(runs)


def graph_view(g: Graph, stage: np.ndarray) -> GraphView:
    """The graph by depth (longest path from a source, in data edges); a graph of more than
    :data:`GRAPH_NODES_DRAWN` nodes is not drawn (``hidden`` counts its nodes)."""
    if g.n > GRAPH_NODES_DRAWN:
        return GraphView((), (), hidden=g.n)
    src, dst = g.data_edges
    order = [int(v) for v in g.topo_order]
    preds: list[list[int]] = [[] for _ in range(g.n)]
    for a, b in zip(src.tolist(), dst.tolist(), strict=True):
        if a != b:
            preds[b].append(a)
    depth = [0] * g.n
    for v in order:
        depth[v] = max((depth[u] + 1 for u in preds[v]), default=0)
    rows: dict[int, int] = {}
    row = [0] * g.n
    for v in order:
        row[v] = rows.get(depth[v], 0)
        rows[depth[v]] = row[v] + 1
    nodes = tuple(GraphNode(g.names[v], int(stage[v]), depth[v], row[v]) for v in range(g.n))
    edges = tuple(GraphEdge(a, b) for b in range(g.n) for a in preds[b])
    return GraphView(nodes, edges)


def timeline_gantt(timeline: list, rows: tuple[GanttRow, ...], title: str) -> Gantt:
    """A simulator's timeline (device or stage, request, kind, start, end) on ``rows``."""
    place = {r.source: i for i, r in enumerate(rows)}
    bars = tuple(
        GanttBar(place[d], rows[place[d]].stage, kind, f"r{req}", start, end)
        for d, req, kind, start, end in timeline
        if d in place and end > start
    )
    return Gantt(title, tuple(r.label for r in rows), bars, ("recv", "compute", "send"))


def schedule_gantt(run: ScheduleRun, blocks: list[int], title: str) -> Gantt:
    """A training schedule's tasks, one row per stage (coloured by its block)."""
    chunks = run.spec.virtual_stages > 1
    bars = tuple(
        GanttBar(
            t.stage,
            blocks[t.stage],
            t.kind,
            f"{t.microbatch}" + (f".{t.chunk}" if chunks else ""),
            t.start,
            t.end,
        )
        for t in run.tasks
    )
    rows = tuple(f"stage {b}" for b in blocks)
    return Gantt(title, rows, bars, ("F", "B"))


LADDER_FIELDS = ("value", "binding", "seconds", "skipped", "bounds")  # not bounds themselves


def bound_ladder(data: dict) -> Ladder | None:
    """The certified bounds a pipeline plan records (``stats.bound``) and its lower bound;
    the bound named binding (else the one equal to the lower bound) binds."""
    objective = optional_number(data.get("objective"))
    lower = optional_number(data.get("lower_bound"))
    if objective is None or lower is None:
        return None
    stats = data.get("stats") if isinstance(data.get("stats"), dict) else {}
    bound = stats.get("bound") if isinstance(stats.get("bound"), dict) else {}
    certified = bound.get("certified") if isinstance(bound.get("certified"), dict) else bound
    binding = bound.get("binding") or certified.get("binding")
    values = certified.get("bounds")
    if not isinstance(values, dict):  # a training plan: {bound name: value, ...} itself
        values = {k: v for k, v in certified.items() if k not in LADDER_FIELDS}
    found = {str(k): optional_number(v) for k, v in values.items()}
    rungs = [Rung(k, v, k == binding) for k, v in found.items() if v is not None]
    if not any(r.binding for r in rungs):
        name = binding if isinstance(binding, str) and binding not in found else "lower bound"
        rungs = [r for r in rungs if r.value < lower] + [Rung(name, lower, True)]
    skipped = certified.get("skipped") if isinstance(certified.get("skipped"), dict) else {}
    computed = {r.name for r in rungs}  # a bound found before the others were tried
    return Ladder(
        objective,
        tuple(rungs),
        tuple(Fact(str(k), str(v)) for k, v in skipped.items() if str(k) not in computed),
    )


def _placement(data: dict, blocks: int) -> list[int]:
    raw = data.get("placement")
    if isinstance(raw, list) and len(raw) == blocks and all(isinstance(x, int) for x in raw):
        return [int(x) for x in raw]
    return list(range(blocks))


def pipeline_stage_rows(data: dict, blocks: list[dict], capacities: list[float | None]) -> tuple:
    """One :class:`StageRow` per block of an inference plan (``Evaluation.blocks()`` form);
    ``capacities[b]``: the hard capacity of block b's device (None: no limit)."""
    device = _placement(data, len(blocks))
    slowest = data.get("bottleneck_block")
    rows = []
    for b, blk in enumerate(blocks):
        if not isinstance(blk, dict):
            raise MtppError(f"block {b} of the plan is not an object")
        value = {k: number(blk.get(k), f"block {b} {k}") for k in BLOCK_KEYS}
        rows.append(
            StageRow(
                stage=b,
                device=str(device[b]),
                nodes=int(value["nodes"]),
                time_parts=tuple(Part(n, value[k]) for n, k in TIME_KEYS),
                memory_parts=(
                    Part("weights", value["param_bytes"]),
                    Part("activations", value["peak_bytes"]),
                ),
                capacity=capacities[b] if b < len(capacities) else None,
                bottleneck=slowest == b and value["nodes"] > 0,
            )
        )
    return tuple(rows)


TIME_KEYS = (("io in", "io_in"), ("work", "work"), ("overflow", "overflow"), ("io out", "io_out"))
BLOCK_KEYS = ("nodes", "io_in", "work", "overflow", "io_out", "param_bytes", "peak_bytes")


def training_stage_rows(data: dict, training: dict) -> tuple:
    """One :class:`StageRow` per stage of a training plan (``TrainingCost.to_dict()`` form):
    time forward and backward, memory as state x weights + peak + in flight x stash."""
    stages = training.get("stages")
    if not isinstance(stages, list):
        raise MtppError("the plan's training section has no list of stages")
    state = number(training.get("optimizer_state", 4.0), "training optimizer_state")
    blocks = [s.get("block") if isinstance(s, dict) else None for s in stages]
    device = _placement(data, max([b for b in blocks if isinstance(b, int)], default=-1) + 1)
    times = [optional_number(s.get("time")) or 0.0 for s in stages if isinstance(s, dict)]
    rows = []
    for i, s in enumerate(stages):
        if not isinstance(s, dict) or not isinstance(s.get("block"), int):
            raise MtppError(f"training stage {i} of the plan names no block")
        v = {k: number(s.get(k), f"training stage {i} {k}") for k in TRAINING_KEYS}
        rows.append(
            StageRow(
                stage=s["block"],
                device=str(device[s["block"]]) if s["block"] < len(device) else "-",
                nodes=int(v["nodes"]),
                time_parts=(Part("forward", v["forward"]), Part("backward", v["backward"])),
                memory_parts=(
                    Part("state x weights", state * v["param_bytes"]),
                    Part("activations", v["peak_bytes"]),
                    Part("in flight x stash", v["inflight"] * v["stash_bytes"]),
                ),
                capacity=optional_number(s.get("capacity_bytes")),
                bottleneck=bool(times) and times[i] == max(times),
            )
        )
    return tuple(rows)


TRAINING_KEYS = ("nodes", "forward", "backward", "param_bytes", "peak_bytes", "inflight")
TRAINING_KEYS += ("stash_bytes",)


def plan_facts(data: dict, kind: str) -> list[Fact]:
    """The summary of a plan's JSON: method, status, objective, bound, gap, cluster."""
    objective = optional_number(data.get("objective"))
    lower = optional_number(data.get("lower_bound"))
    cluster = data.get("cluster") if isinstance(data.get("cluster"), dict) else {}
    what = "iteration time" if kind == "training" else "period (s per request)"
    facts = [
        Fact("method", str(data.get("method", "-"))[:60]),
        Fact("status", str(data.get("status", "-"))[:40]),
        Fact(what, shown_time(objective)),
        Fact("lower bound", shown_time(lower)),
        Fact(
            "gap",
            "-" if objective is None or lower is None else percent(objective - lower, objective),
        ),
    ]
    throughput = optional_number(data.get("throughput"))
    if throughput is not None and kind != "training":
        facts.append(Fact("throughput", f"{throughput:.6g} requests/s"))
    latency = optional_number(data.get("latency"))
    if latency is not None and kind != "training":
        facts.append(Fact("latency (one request)", format_time(latency)))
    if cluster:
        facts.append(
            Fact(
                "cluster", f"{str(cluster.get('name', '-'))[:60]}, {cluster.get('devices')} devices"
            )
        )
    return facts


@dataclass(frozen=True)
class PipelineView:
    """What a pipeline plan's report is built from: the plan file's content, its blocks (as
    recorded, or recomputed from the model), every node's block in topological order, and the
    drawings that need the model (None without it)."""

    data: dict
    title: str
    blocks: list[dict]
    names: list[str]
    stages: list[int]
    capacities: list[float | None]  # per block: its device's hard capacity (None: no limit)
    graph: GraphView | None = None
    gantt: Gantt | None = None
    notes: tuple[str, ...] = ()
    path: str = "the plan"  # the plan file, named in refusals


MAX_GANTT_TASKS = 20_000  # a longer schedule is not drawn (the page would be megabytes)


def pipeline_report(view: PipelineView) -> Report:
    """The report of a pipeline plan, inference or training (a ``"training"`` section)."""
    data = view.data
    training = data.get("training") if isinstance(data.get("training"), dict) else None
    kind = "pipeline" if training is None else "training"
    facts = plan_facts(data, kind)
    notes = list(view.notes)
    gantt = view.gantt
    if training is None:
        rows = pipeline_stage_rows(data, view.blocks, view.capacities)
    else:
        rows = training_stage_rows(data, training)
        spec = read_plan_training(data, view.path)
        facts[1:1] = [Fact("schedule", _schedule_words(spec))]
        gantt, note = training_gantt(training, spec, [r.stage for r in rows])
        notes += [note] if note else []
    if view.graph is not None and view.graph.hidden:
        notes.append(
            f"the graph has {view.graph.hidden} nodes, more than {GRAPH_NODES_DRAWN}: only "
            "the sequence strip shows it"
        )
    return Report(
        title=view.title,
        kind=kind,
        status=str(data.get("status", "-"))[:40],
        facts=tuple(facts),
        stages=rows,
        ladder=bound_ladder(data),
        sequence=sequence_runs(view.names, view.stages),
        graph=view.graph if view.graph is not None and not view.graph.hidden else None,
        gantt=gantt,
        notes=tuple(notes),
    )


def _schedule_words(spec: TrainingSpec) -> str:
    chunks = f", {spec.virtual_stages} chunks per stage" if spec.virtual_stages > 1 else ""
    return f"{spec.schedule}, {spec.microbatches} microbatches{chunks}"


def training_gantt(
    training: dict, spec: TrainingSpec, blocks: list[int]
) -> tuple[Gantt | None, str | None]:
    """The training schedule simulated from the stages' forward and backward times (and a
    note instead when it is too long to draw)."""
    stages = [s for s in training.get("stages", []) if isinstance(s, dict)]
    tasks = 2 * spec.microbatches * spec.virtual_stages * len(stages)
    if tasks > MAX_GANTT_TASKS:
        return None, (
            f"the schedule has {tasks:,} tasks, more than {MAX_GANTT_TASKS:,}: its Gantt "
            "chart is not drawn"
        )
    forward = [number(s.get("forward"), "training stage forward") for s in stages]
    backward = [number(s.get("backward"), "training stage backward") for s in stages]
    run = simulate_schedule(np.array(forward), np.array(backward), spec)
    title = (
        f"{_schedule_words(spec)}: makespan {format_time(run.makespan)} (simulated from the "
        "stages' forward and backward times; light: forward, dark: backward; labels: "
        "microbatch)"
    )
    return schedule_gantt(run, blocks, title), None


def joint_report(plan: JointPlan, gantt: Gantt | None, notes: tuple[str, ...] = ()) -> Report:
    """The report of a joint plan: stages on sub-meshes, the bound over the plan's space and
    the universal bound, the joint simulator's timeline (when the model was found)."""
    data = plan.to_dict()
    scoped = {"lower bound": "lower bound (searched space)", "gap": "gap (searched space)"}
    facts = [Fact(scoped.get(f.label, f.label), f.value) for f in plan_facts(data, "joint")]
    facts.insert(1, Fact("space searched", plan.space))
    slowest = max((s.time for s in plan.stages), default=0.0)
    rows = tuple(
        StageRow(
            stage=s.index,
            device=device_ranges(list(s.devices)) + f" (mesh {'x'.join(map(str, s.mesh.shape))})",
            nodes=len(s.ops),
            time_parts=(
                Part("io in", s.io_in),
                Part("program", s.program_time),
                Part("io out", s.io_out),
            ),
            memory_parts=(Part("per device", s.memory_per_device),),
            capacity=plan.memory_limit,
            bottleneck=s.time == slowest,
        )
        for s in plan.stages
    )
    return Report(
        title=f"joint plan of {plan.model_name}",
        kind="joint",
        status=plan.status,
        facts=tuple(facts),
        stages=rows,
        ladder=joint_ladder(plan),
        sequence=sequence_runs(
            [op for s in plan.stages for op in s.ops],
            [s.index for s in plan.stages for _ in s.ops],
        ),
        gantt=gantt,
        notes=notes,
    )


def joint_ladder(plan: JointPlan) -> Ladder | None:
    """The joint plan's bound (over the space it searched) and its universal bound."""
    rungs = []
    if plan.lower_bound is not None:
        rungs.append(
            Rung("bound over the searched space", plan.lower_bound, True, plan.bound_space)
        )
    if plan.universal_bound is not None:
        rungs.append(
            Rung("universal bound", plan.universal_bound, False, "every joint plan on this cluster")
        )
    return Ladder(plan.objective, tuple(rungs)) if rungs else None


def spmd_report(data: dict) -> Report:
    """The report of a sharded plan (``mtpp shard``'s plan.json): the mesh and one row per
    operator with its strategy, local shape, compute and communication."""
    mesh = data.get("mesh") if isinstance(data.get("mesh"), dict) else {}
    shape = tuple(int(x) for x in mesh.get("shape", []) if isinstance(x, int))
    devices = int(np.prod(shape)) if shape else 1
    ops = data.get("operators") if isinstance(data.get("operators"), list) else []
    rows = tuple(_operator_row(i, op) for i, op in enumerate(ops))
    facts = plan_facts(data, "spmd")
    facts.insert(1, Fact("mesh", " x ".join(map(str, shape)) or "-"))
    for label, key in (("compute", "compute_time"), ("communication", "communication_time")):
        facts.append(Fact(label, shown_time(optional_number(data.get(key)))))
    facts.append(
        Fact("memory per device", shown_bytes(optional_number(data.get("max_memory_per_device"))))
    )
    stats = data.get("stats") if isinstance(data.get("stats"), dict) else {}
    lower, objective = (
        optional_number(data.get("lower_bound")),
        optional_number(data.get("objective")),
    )
    ladder = None
    if lower is not None and objective is not None:
        name = str(stats.get("bound") or "lower bound")[:80]
        scope = "every sharding on this mesh" + (
            " with the configured operators' strategies" if data.get("configured") else ""
        )
        ladder = Ladder(objective, (Rung(name, lower, True, scope),))
    bandwidth = tuple(x for x in (optional_number(b) for b in mesh.get("bandwidth", [])) if x)
    return Report(
        title=f"sharded plan of {str(data.get('model', '-'))[:200]}",
        kind="spmd",
        status=str(data.get("status", "-"))[:40],
        facts=tuple(facts),
        ladder=ladder,
        operators=rows,
        mesh=MeshView(shape, tuple(range(devices)), bandwidth),
    )


def _operator_row(i: int, op: object) -> OperatorRow:
    if not isinstance(op, dict):
        raise MtppError(f"operator {i} of the plan is not an object")
    strategy = op.get("strategy")
    shape = op.get("local_shape") if isinstance(op.get("local_shape"), list) else []
    return OperatorRow(
        name=str(op.get("name", "-")),
        op_type=str(op.get("op_type", "-")),
        strategy=_strategy_text(strategy),
        local_shape=" ".join("x".join(map(str, s)) or "()" for s in shape if isinstance(s, list)),
        compute=number(op.get("compute"), f"operator {i} compute"),
        communication=number(op.get("communication"), f"operator {i} communication"),
    )


def _strategy_text(strategy: object) -> str:
    """``[[1, 4], [4, 1]]`` as ``[1,4] [4,1]`` (a slice count per dimension, per input)."""
    if not isinstance(strategy, list):
        return str(strategy)
    return " ".join(
        "[" + ",".join(map(str, s)) + "]" if isinstance(s, list) else str(s) for s in strategy
    )
