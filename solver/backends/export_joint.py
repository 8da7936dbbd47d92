"""A joint plan as files, and the numeric proof that its chain of sharded stages computes the
model (``mtpp export MODEL --plan joint.json --out DIR [--verify]``).

Folder layout (written to a temporary folder beside ``DIR`` and renamed into place):

- ``stage_{s}/annotated.onnx``: the stage's sub-model, cut from the model by tensor names
  (inputs = ``stage.inputs``, outputs = ``stage.outputs``), every node carrying its strategy
  in ``metadata_props`` (``mtpp shard`` reads it back); weights stored outside the model are
  copied by byte range into ``annotated.onnx.data`` beside it, never read into Python;
- ``stage_{s}/strategies.yaml`` and ``stage_{s}/plan.json``: what ``mtpp shard --out`` writes
  for that stage on its mesh (the sharded program, its collectives and memory);
- ``plan.json`` (the joint plan as given) and ``manifest.json`` (stages, devices, files).

``--verify`` feeds seeded random inputs through the chain: each stage runs on its emulated
devices with its strategies (:func:`solver.backends.spmd_execute.run_sharded`) and hands its outputs
to the next stages; every boundary tensor and every model output is compared with onnxruntime
on the whole model (:func:`solver.backends.verify.verify_chain`). The first tensor beyond
tolerance names its stage.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from solver.backends.export import DataFiles, write_model
from solver.backends.verify import verify_chain, verify_memory
from solver.core.errors import MtppError, first_line
from solver.core.files import check_output_dir, json_safe
from solver.core.outdir import replace_dir, temp_dir_beside
from solver.frontends.onnx.common import subgraph_inputs
from solver.frontends.onnx.ort import check_memory
from solver.joint.submesh import sub_cluster
from solver.spmd.config import (
    ATTRIBUTE,
    annotate,
    attributes_to_metadata,
    dump_yaml,
    from_attributes,
)
from solver.spmd.model import ShardModel, Unloaded, from_proto, load_model
from solver.spmd.program import Planner, evaluate
from solver.spmd.report import plan_dict

STAGE_DIR = "stage_{}"


# ---------------------------------------------------------------------- checks
def check_stages(plan, sm: ShardModel) -> None:
    """Refuse (one line naming what to fix) a plan whose stages do not fit the model and its
    cluster: devices out of range or shared by two stages, a mesh that is not the stage's
    device count, an unknown operator, an operator in no stage or in two, a strategy missing
    or for an operator of another stage, or an operator reading a later stage's output."""
    cluster = plan.cluster
    owner: dict[int, int] = {}
    stage_of: dict[str, int] = {}
    for st in plan.stages:
        s = st.index
        if not st.devices or not st.ops:
            what = "devices" if not st.devices else "operators"
            raise MtppError(f"stage {s} has no {what}; give every stage at least one")
        for d in st.devices:
            if not 0 <= int(d) < cluster.devices:
                raise MtppError(
                    f"stage {s} uses device {d}, but the cluster has devices "
                    f"0..{cluster.devices - 1}"
                )
            if int(d) in owner:
                raise MtppError(
                    f"device {d} is in stage {owner[int(d)]} and stage {s}; stages must run "
                    "on disjoint devices"
                )
            owner[int(d)] = s
        if math.prod(st.mesh.shape) != len(st.devices):
            raise MtppError(
                f"stage {s}: mesh {list(st.mesh.shape)} has {math.prod(st.mesh.shape)} devices "
                f"but the stage lists {len(st.devices)}"
            )
        for name in st.ops:
            if sm.op_by_name(name) is None:
                raise MtppError(f"stage {s}: the model has no operator named {name!r}")
            if name in stage_of:
                raise MtppError(f"operator {name!r} is in stage {stage_of[name]} and stage {s}")
            stage_of[name] = s
        extra = sorted(set(st.strategies) - set(st.ops))
        if extra:
            raise MtppError(f"stage {s}: a strategy is given for {extra[0]!r}, not one of its ops")
        missing = [n for n in st.ops if n not in st.strategies]
        if missing:
            raise MtppError(f"stage {s}: operator {missing[0]!r} has no strategy")
    left = [op.name for op in sm.ops if op.name not in stage_of]
    if left:
        raise MtppError(f"operator {left[0]!r} is in no stage; every operator needs one")
    position = {st.index: i for i, st in enumerate(plan.stages)}
    for op in sm.ops:
        for t in op.reads:
            u = sm.producer.get(t)
            if u is None:
                continue
            src, dst = stage_of[sm.ops[u].name], stage_of[op.name]
            if position[src] > position[dst]:
                raise MtppError(
                    f"operator {op.name!r} in stage {dst} reads {t!r} from the later stage "
                    f"{src}; stages must follow the graph order"
                )


# ---------------------------------------------------------------------- stage sub-models
def _static_nodes(model, sm: ShardModel) -> set[int]:
    """Nodes folded away by the sharding model whose every input is a weight or the output of
    another such node: they are copied into each stage that reads them (as the pipeline
    exporter does), keeping their weights by reference."""
    ops = {op.node_index for op in sm.ops}
    known = {t.name for t in model.graph.initializer}
    static: set[int] = set()
    for i, node in enumerate(model.graph.node):
        if i not in ops and all(x in known for x in node.input if x):
            static.add(i)
            known.update(o for o in node.output if o)
    return static


def _absent_weight(name: str, value: Unloaded):
    """A weight whose bytes are absent, as an external-data initializer (shape and type only:
    :func:`solver.spmd.model.from_proto` reads it back as the same :class:`Unloaded`)."""
    from onnx import TensorProto, helper

    t = TensorProto(name=name, dims=list(value.shape))
    t.data_type = helper.np_dtype_to_tensor_dtype(value.dtype)
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="absent")
    return t


def stage_model(model, sm: ShardModel, stage):
    """The stage's ONNX sub-model: its operators' nodes, the constant nodes and weights they
    read, inputs ``stage.inputs`` and outputs ``stage.outputs`` with the model's fixed shapes.

    ``model`` is the model with the same node order as ``sm`` (external weights may stay by
    reference). Nodes get their operator's name (unnamed nodes are named as mtpp names them),
    so strategies match by name. A constant computed from activations (the shape of one)
    becomes an initializer with its folded value.
    """
    cut = _StageCut(stage, _operator_nodes(sm, stage), list(dict.fromkeys(stage.inputs)))
    _close_over_constants(model, sm, cut)
    _check_boundary(model, sm, cut)
    return _stage_graph(model, sm, cut)


@dataclass
class _StageCut:
    """The nodes and weights of one stage's sub-model, as :func:`stage_model` gathers them."""

    stage: Any  # the joint plan's stage
    operators: dict[int, str]  # node index -> operator name, for the stage's operators
    inputs: list[str]  # the stage's inputs, each once
    nodes: set[int] = field(default_factory=set)  # operators and the constant nodes they read
    inits: dict[str, Any] = field(default_factory=dict)  # initializer protos, by name


def _operator_nodes(sm: ShardModel, stage) -> dict[int, str]:
    """Node index -> name of each of the stage's operators; refuses a name the model lacks."""
    index = {}
    for name in stage.ops:
        op = sm.op_by_name(name)
        if op is None:
            raise MtppError(f"stage {stage.index}: the model has no operator named {name!r}")
        index[op.node_index] = name
    return index


def _close_over_constants(model, sm: ShardModel, cut: _StageCut) -> None:
    """Add to ``cut`` every weight and constant node its operators read, transitively; refuse
    an activation read from outside that is not among the stage's inputs."""
    from onnx import numpy_helper  # heavy: onnx

    g = model.graph
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    inits = {t.name: t for t in g.initializer}
    static = _static_nodes(model, sm)
    cut.nodes, todo = set(cut.operators), list(cut.operators)
    while todo:
        i = todo.pop()
        for x in [*g.node[i].input, *subgraph_inputs(g.node[i])]:  # bodies read outer names
            if not x or x in cut.inputs or x in cut.inits:
                continue
            p = producer.get(x)
            if p is not None and p in cut.operators:  # made inside the stage
                continue
            if x in inits:
                cut.inits[x] = inits[x]
            elif p is not None and p in static:
                if p not in cut.nodes:
                    cut.nodes.add(p)
                    todo.append(p)
            elif x in sm.consts and sm.producer.get(x) is None:
                value = sm.consts[x]
                cut.inits[x] = (
                    _absent_weight(x, value)
                    if isinstance(value, Unloaded)
                    else numpy_helper.from_array(np.asarray(value), x)
                )
            else:
                where = "a model input" if p is None else f"made by {g.node[p].name or p!r}"
                raise MtppError(
                    f"stage {cut.stage.index} reads {x!r} ({where}) but does not list it "
                    "among its inputs"
                )


def _check_boundary(model, sm: ShardModel, cut: _StageCut) -> None:
    """Refuse an input that is not an activation, or an output no operator of the stage makes."""
    s = cut.stage.index
    for x in cut.inputs:
        if x not in sm.shapes or x in sm.consts:
            raise MtppError(f"stage {s}: input {x!r} is not an activation of the model")
    produced = {o for i in cut.operators for o in model.graph.node[i].output if o}
    for x in cut.stage.outputs:
        if x not in produced:
            raise MtppError(f"stage {s}: output {x!r} is not made by one of its operators")


def _stage_graph(model, sm: ShardModel, cut: _StageCut):
    """The sub-model of ``cut``: copies of its nodes (operators under their names), its
    initializers, and its inputs and outputs with the model's shapes and types."""
    from onnx import helper  # heavy: onnx

    g = model.graph
    nodes = []
    for i in sorted(cut.nodes):
        node = type(g.node[i])()
        node.CopyFrom(g.node[i])
        if i in cut.operators:
            node.name = cut.operators[i]
        nodes.append(node)

    def info(x: str):
        elem = helper.np_dtype_to_tensor_dtype(sm.dtypes[x])
        return helper.make_tensor_value_info(x, elem, list(sm.shapes[x]))

    graph = helper.make_graph(
        nodes,
        f"{g.name or 'model'}_stage{cut.stage.index}",
        [info(x) for x in cut.inputs],
        [info(x) for x in cut.stage.outputs],
        initializer=list(cut.inits.values()),
    )
    m = helper.make_model(graph, opset_imports=list(model.opset_import))
    m.ir_version = max(model.ir_version, 4)
    m.functions.extend(model.functions)
    return m


@dataclass
class StageProgram:
    """One stage as the sharding package sees it: its sub-model, planner and program."""

    stage: object
    sm: ShardModel
    planner: object
    program: object


def stage_programs(plan, sm: ShardModel) -> list[StageProgram]:
    """Every stage's sharded program on its mesh, priced by :func:`solver.spmd.evaluate`
    on the stage's sub-model (``sm`` as :func:`solver.spmd.load_model` read the model) at
    its slowest device's compute (:func:`solver.joint.submesh.sub_cluster`)."""
    check_stages(plan, sm)
    out = []
    for st in plan.stages:
        sub = from_proto(stage_model(sm.model, sm, st), {}, f"stage {st.index}")
        planner = Planner(sub, st.mesh, sub_cluster(plan.cluster, st.devices))
        strategies = {name: tuple(tuple(x) for x in st.strategies[name]) for name in st.ops}
        names = {op.name for op in sub.ops}
        folded = [n for n in st.ops if n not in names]
        if folded:  # the sub-model folded it away: the plan was made for another model
            raise MtppError(f"stage {st.index}: operator {folded[0]!r} is constant in its stage")
        try:
            program = evaluate(planner, strategies)
        except MtppError as e:
            raise MtppError(f"stage {st.index}: {first_line(e)}") from None
        out.append(StageProgram(st, sub, planner, program))
    return out


# ---------------------------------------------------------------------- export
def _written_programs(plan, folder: Path) -> list[StageProgram]:
    """The stages as written: each ``stage_{s}/annotated.onnx`` loaded back (weights from its
    own data file) with the strategies its nodes carry, priced on the stage's mesh."""
    out = []
    for st in plan.stages:
        sub = load_model(folder / STAGE_DIR.format(st.index) / "annotated.onnx")
        planner = Planner(sub, st.mesh, sub_cluster(plan.cluster, st.devices))
        out.append(StageProgram(st, sub, planner, evaluate(planner, from_attributes(sub))))
    return out


def _fix_scalar_annotations(m, strategies: dict) -> None:
    """Rewrite the annotation of a node whose only data input is a scalar (an If's condition):
    the seed notation ``(())`` reads back as no input at all, ``((),)`` reads back right."""
    for node in m.graph.node:
        if strategies.get(node.name) == ((),):
            for e in node.metadata_props:
                if e.key == ATTRIBUTE:
                    e.value = "((),)"


@dataclass
class _StageFiles:
    """The files of one stage folder and the weight bytes copied into them."""

    files: list[str]
    weight_bytes: int


def _write_stage(
    model, sm: ShardModel, p: StageProgram, src_dir: Path, folder: Path, status
) -> _StageFiles:
    """``annotated.onnx`` (+ its data file), ``strategies.yaml`` and ``plan.json`` of one
    stage."""
    st = p.stage
    folder.mkdir()
    strategies = {op.name: p.program.shardings[op.index].strategy for op in p.sm.ops}
    m = stage_model(model, sm, st)
    annotate(m, strategies, {n.name: i for i, n in enumerate(m.graph.node) if n.name})
    _fix_scalar_annotations(m, strategies)
    data = DataFiles(src_dir, folder)
    try:
        write_model(m, folder / "annotated.onnx", data, reuse=False)
        files = ["annotated.onnx", *sorted(data.dst)]
    finally:
        data.close()
    (folder / "strategies.yaml").write_text(dump_yaml(strategies))
    shard = plan_dict(p.planner, p.program, "joint", status)
    shard.update(stage=st.index, devices=[int(d) for d in st.devices])
    _write_json(folder / "plan.json", shard)
    return _StageFiles([*files, "strategies.yaml", "plan.json"], data.copied)


@dataclass
class _StagesWritten:
    """Every stage folder written: the manifest's rows and the weight bytes copied."""

    rows: list[dict]
    weight_bytes: int


def _write_stages(
    model, sm: ShardModel, programs: list[StageProgram], src_dir: Path, tmp: Path, status
) -> _StagesWritten:
    """One folder per stage in ``tmp`` (:func:`_write_stage`), each described by a manifest row."""
    rows, copied = [], 0
    for p in programs:
        st = p.stage
        name = STAGE_DIR.format(st.index)
        written = _write_stage(model, sm, p, src_dir, tmp / name, status)
        copied += written.weight_bytes
        rows.append(
            {
                "stage": st.index,
                "folder": name,
                "files": written.files,
                "devices": [int(d) for d in st.devices],
                "mesh": list(st.mesh.shape),
                "ops": len(st.ops),
                "inputs": list(st.inputs),
                "outputs": list(st.outputs),
                "program_time": p.program.objective,
                "collectives": p.program.collectives(),
                "memory_per_device": p.program.memory_per_device,
            }
        )
    return _StagesWritten(rows, copied)


def _write_json(path: Path, data: dict) -> None:
    """``data`` as strict JSON (numpy values plain, NaN and infinities as null)."""
    path.write_text(json.dumps(json_safe(data), indent=1, allow_nan=False) + "\n")


def export_joint(
    plan,
    model_path: str | Path,
    out_dir: str | Path,
    *,
    plan_path: str | Path | None = None,
    dims: dict[str, int] | None = None,
    verify: bool = False,
    tolerance: float | None = None,
    seed: int = 0,
    force: bool = False,
    inputs: list[str | Path] = (),
    verify_memory_ok: bool = False,
) -> dict:
    """Write one folder per stage, ``plan.json`` and ``manifest.json`` into ``out_dir`` (see
    the module docstring); with ``verify`` run the chain from the written files, refused
    before anything is written when :func:`solver.backends.verify.verify_memory` exceeds the
    memory available (unless ``verify_memory_ok``). Returns the manifest (with ``verify``).
    ``out_dir`` is refused as :func:`check_output_dir` says."""
    import onnx  # heavy: onnx

    model_path, out_dir = Path(model_path), Path(out_dir)
    given = [model_path, *([plan_path] if plan_path else []), *inputs]
    check_output_dir(out_dir, given, force=force, what="export")
    sm = load_model(model_path, dims)
    programs = stage_programs(plan, sm)
    needed = verify_memory(sm, programs) if verify else 0.0
    if verify and not verify_memory_ok:
        check_memory(
            needed,
            "--verify (the whole model in onnxruntime, then each stage on its emulated devices)",
            "estimated",
            "pass --verify-memory-ok to run it anyway, or export without --verify",
        )
    model = onnx.load(str(model_path), load_external_data=False)  # weights by reference
    attributes_to_metadata(model)
    tmp = temp_dir_beside(out_dir)
    try:
        written = _write_stages(model, sm, programs, model_path.parent, tmp, plan.status)
        if plan_path is not None:
            shutil.copyfile(plan_path, tmp / "plan.json")
        else:
            _write_json(tmp / "plan.json", plan.to_dict())
        manifest = {
            "format": "mtpp-joint-export",
            "model": str(model_path),
            "plan": "plan.json",
            "cluster": plan.cluster.name,
            "stages": written.rows,
            "model_outputs": list(sm.outputs),
            "weight_bytes_copied": written.weight_bytes,
        }
        if verify:
            stages = _written_programs(plan, tmp)
            manifest["verify"] = verify_chain(plan, sm, stages, seed=seed, tolerance=tolerance)
            manifest["verify"]["memory_estimate"] = needed
        _write_json(tmp / "manifest.json", manifest)
        (tmp / "README.txt").write_text(readme(manifest))
        replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def readme(manifest: dict) -> str:
    """The folder in words: which stage runs where, reading and sending what."""
    lines = [
        f"Joint plan of {manifest['model']} on {manifest['cluster']}: "
        f"{len(manifest['stages'])} pipeline stages, each an SPMD program on its devices.",
        "plan.json: the joint plan; manifest.json: this summary as data.",
        "",
    ]
    for st in manifest["stages"]:
        lines += [
            f"{st['folder']}/: devices {st['devices']} (mesh {st['mesh']}), {st['ops']} operators",
            f"  receives {', '.join(st['inputs']) or 'nothing'}",
            f"  sends {', '.join(st['outputs']) or 'nothing'}",
            "  annotated.onnx (strategies in metadata_props: mtpp shard reads them), "
            "strategies.yaml, plan.json (the sharded program)",
        ]
    return "\n".join(lines) + "\n"
