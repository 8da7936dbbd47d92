"""A joint plan's stages as the sharding package sees them: the checks that a plan's stages
fit its model and cluster (:func:`check_stages`), each stage's ONNX sub-model cut from the model
by tensor names (:func:`stage_model`) and its sharded program priced on its mesh
(:func:`stage_programs`). The simulator, the exporter (:mod:`solver.backends.export_joint`)
and the command line's plan loading read them from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from solver.core.errors import MtppError, first_line
from solver.frontends.onnx.common import subgraph_inputs
from solver.joint.submesh import sub_cluster
from solver.spmd.model import ShardModel, Unloaded, from_proto
from solver.spmd.program import Planner, evaluate


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
