"""Run a sharded program on emulated devices (pure execution, no comparison).

Each device holds its own numpy buffers. An operator runs on every device over its local
shards with ONNX semantics (a single-node onnxruntime session per operator and local shape);
the distributed-operator details are explicit here: a view reshapes to the local output shape,
a split ReduceMean scales its local mean, a Gather over a split vocabulary looks up locally
with a mask (partial sums), and a bias under a split contraction is added on one partial-sum
device only. Redistributions run step by step through :mod:`solver.spmd.collectives`.
Outputs are reassembled from their layouts; :mod:`solver.backends.verify` compares them with
onnxruntime on the whole model.
"""

from __future__ import annotations

import math

import numpy as np

from solver.core.errors import MtppError, first_line
from solver.frontends.onnx.ort import check_input_size
from solver.spmd.collectives import apply, assemble, scatter
from solver.spmd.model import ShardModel, Unloaded
from solver.spmd.program import Planner, Program

_SESSIONS: dict = {}


def _session(sm: ShardModel, node, shapes_in: list, consts: dict, outer: dict | None = None):
    """A cached onnxruntime session running ``node`` alone; input k is named ``in{k}`` (a tensor
    fed twice gets two names), ``shapes_in[k]`` its local (shape, dtype), ``consts`` the
    static inputs by position; ``outer`` maps the outer-scope names of a control-flow node's
    bodies to (shape, dtype), fed under their own names so that the bodies find them."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    outer = outer or {}
    key = (
        node.SerializeToString(),
        tuple(shapes_in),
        tuple((k, np.asarray(v).tobytes()) for k, v in sorted(consts.items())),
        tuple(sorted(outer.items())),
    )
    sess = _SESSIONS.get(key)
    if sess is not None:
        return sess
    names = [f"in{k}" if t else "" for k, t in enumerate(node.input)]
    one = helper.make_node(node.op_type, names, list(node.output), domain=node.domain)
    one.attribute.extend(node.attribute)
    inputs, inits = [], []
    for k, nm in enumerate(names):
        if not nm:
            continue
        if k in consts:
            inits.append(numpy_helper.from_array(np.asarray(consts[k]), nm))
        else:
            shape, dtype = shapes_in[k]
            elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
            inputs.append(helper.make_tensor_value_info(nm, elem, list(shape)))
    for nm, (shape, dtype) in outer.items():
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        inputs.append(helper.make_tensor_value_info(nm, elem, list(shape)))
    outputs = [helper.make_empty_tensor_value_info(t) for t in node.output if t]
    graph = helper.make_graph([one], "one", inputs, outputs, inits)
    m = helper.make_model(graph, opset_imports=list(sm.model.opset_import))
    m.ir_version = sm.model.ir_version
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    _SESSIONS[key] = sess
    return sess


def _run_local(
    sm: ShardModel, op, sh, local: list[np.ndarray], rank: int, outer: dict | None = None
) -> list[np.ndarray]:
    """Operator ``op`` on one device's local data inputs (positions of ``op.data``) and, for a
    control-flow op, the whole values of its outer-scope inputs (``outer``, by name)."""
    node = op.node
    if sh.kind == "reshape":
        return [local[0].reshape(sh.out_layouts[0].local_shape)]
    local = list(local)
    if sh.kind == "gather":
        data, idx = local
        axis = int(next((a.i for a in node.attribute if a.name == "axis"), 0)) % data.ndim
        lay = sh.in_layouts[0]
        start = lay.block(rank)[axis].start
        full = lay.shape[axis]
        idx = np.where(idx < 0, idx + full, idx) - start
        mask = (idx >= 0) & (idx < data.shape[axis])
        out = np.take(data, np.where(mask, idx, 0), axis=axis)
        shape = [1] * out.ndim
        for d in range(idx.ndim):
            shape[axis + d] = idx.shape[d]
        return [np.where(mask.reshape(shape), out, 0).astype(data.dtype)]
    if sh.kind == "bias_once" and len(local) > 2 and sh.out_layouts[0].partial:
        c = sh.out_layouts[0].coords(rank)
        if any(c[a] for a in sh.out_layouts[0].partial):
            local[2] = np.zeros_like(local[2])
    feeds, shapes_in, consts = {}, [None] * len(node.input), {}
    data_pos = dict(zip(op.data, local, strict=True))
    for k, t in enumerate(node.input):
        if not t:
            continue
        if k in data_pos:
            feeds[f"in{k}"] = data_pos[k]
            shapes_in[k] = (tuple(data_pos[k].shape), str(data_pos[k].dtype))
        else:
            consts[k] = sm.consts[t]
    outer = outer or {}
    feeds.update(outer)
    sess = _session(
        sm, node, shapes_in, consts, {t: (tuple(v.shape), str(v.dtype)) for t, v in outer.items()}
    )
    outs = sess.run(None, feeds)
    if sh.kind == "reducemean" and sh.out_layouts[0].partial:
        n = math.prod(sh.device_matrix[a] for a in sh.out_layouts[0].partial)
        outs = [o / np.asarray(n, dtype=o.dtype) for o in outs]
    return outs


def run_sharded(planner: Planner, program: Program, feeds: dict[str, np.ndarray]) -> dict:
    """Execute ``program``; returns output name -> the reassembled global array."""
    sm = planner.sm
    p = planner.devices
    env: dict[str, list[np.ndarray]] = {}
    for v, op in enumerate(sm.ops):
        sh = program.shardings[v]
        per_input = []
        for k, t in enumerate(op.data_inputs):
            if t in env:
                r = program.redists[(v, k)]
                per_input.append(apply(r, env[t]))
            else:
                full = feeds[t] if t in feeds else sm.consts[t]
                if isinstance(full, Unloaded):
                    raise MtppError(
                        f"weight {t!r} is stored outside the model and its file is absent; "
                        "--verify needs the weights"
                    )
                per_input.append(scatter(np.asarray(full), sh.in_layouts[k]))
        outer = {t: _whole(sm, program, env, feeds, t) for t in op.outer}
        results = []
        for r in range(p):
            try:
                results.append(_run_local(sm, op, sh, [b[r] for b in per_input], r, outer))
            except MtppError:
                raise
            except Exception as e:  # noqa: BLE001 - a wrong program fails verify, not the CLI
                raise ValueError(f"node {op.name!r} on device {r}: {first_line(e)}") from None
        for j, t in enumerate(op.outputs):
            env[t] = [results[r][j] for r in range(p)]
    out = {}
    for t in sm.outputs:
        if t not in env:
            out[t] = np.asarray(feeds.get(t, sm.consts.get(t)))
            continue
        bufs, lay = env[t], program.layouts[t]
        r = program.output_redists.get(t)
        if r is not None:
            bufs, lay = apply(r, bufs), r.dst
        out[t] = assemble(bufs, lay)
    return out


def _whole(sm: ShardModel, program: Program, env: dict, feeds: dict, t: str) -> np.ndarray:
    """The whole value of tensor ``t`` (an outer-scope input of a control-flow op, which every
    device reads whole): reassembled from its devices' buffers, or a model input or weight."""
    if t in env:
        return assemble(env[t], program.layouts[t])
    full = feeds[t] if t in feeds else sm.consts[t]
    if isinstance(full, Unloaded):
        raise MtppError(
            f"weight {t!r} is stored outside the model and its file is absent; --verify needs "
            "the weights"
        )
    return np.asarray(full)


def random_inputs(sm: ShardModel, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random model inputs; integer inputs stay inside the range their Gathers index."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for t in sm.inputs:
        shape, dtype = sm.shapes[t], sm.dtypes[t]
        check_input_size(t, shape, dtype)
        if np.issubdtype(dtype, np.integer):
            high = 10
            for i in sm.consumers.get(t, []):
                op = sm.ops[i]
                if op.op_type == "Gather" and op.data_inputs[1] == t:
                    high = sm.shapes[op.data_inputs[0]][0]
            feeds[t] = rng.integers(0, high, size=shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[t] = rng.random(shape) < 0.5
        else:
            feeds[t] = rng.standard_normal(shape).astype(dtype)
    return feeds


def reference(sm: ShardModel, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The unsplit model on onnxruntime."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(
        sm.model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds), strict=True))
