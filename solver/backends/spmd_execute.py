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
from dataclasses import dataclass

import numpy as np

from solver.core.errors import MtppError, first_line
from solver.frontends.onnx.ort import check_input_size
from solver.spmd.collectives import apply, assemble, scatter
from solver.spmd.model import ShardModel, Unloaded
from solver.spmd.program import Planner, Program
from solver.spmd.training import gradient_layout, without_partial

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


@dataclass
class Trace:
    """What the forward left on every device: each tensor's buffers (``env``) and each
    operator's data inputs as it read them (after their redistributions), for the backward."""

    env: dict[str, list[np.ndarray]]
    inputs: list[list[list[np.ndarray]]]


def run_sharded(planner: Planner, program: Program, feeds: dict[str, np.ndarray]) -> dict:
    """Execute ``program``; returns output name -> the reassembled global array."""
    return outputs_of(planner, program, feeds, run_forward(planner, program, feeds))


def run_forward(planner: Planner, program: Program, feeds: dict[str, np.ndarray]) -> Trace:
    """Every operator on every device, in order; the buffers it leaves."""
    sm = planner.sm
    p = planner.devices
    env: dict[str, list[np.ndarray]] = {}
    inputs = []
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
        inputs.append(per_input)
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
    return Trace(env, inputs)


def outputs_of(planner: Planner, program: Program, feeds: dict, trace: Trace) -> dict:
    """The model's outputs, reassembled from the devices (partial sums reduced)."""
    sm = planner.sm
    env = trace.env
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


# ---------------------------------------------------------------------- the backward (--training)
BACKWARD_OPS = ("MatMul", "Gemm", "Add", "Sub", "Mul", "Relu", "Tanh", "Sigmoid", "Identity")
GRADIENT_TOLERANCE = 1e-4  # relative: float32 shards against float64 central differences
DIRECTIONS = 3  # random directions per weight
STEP = 1e-6  # relative step of the central differences (float64): far from any Relu kink


@dataclass
class LocalOp:
    """One operator on one device, as its local backward sees it."""

    op_type: str
    attrs: dict
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]


def _unbroadcast(g: np.ndarray, shape: tuple) -> np.ndarray:
    """The gradient of a broadcast input: ``g`` summed over the dims the input was broadcast."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for d, n in enumerate(shape):
        if n == 1 and g.shape[d] != 1:
            g = g.sum(axis=d, keepdims=True)
    return g


def _matmul_vjp(a: np.ndarray, b: np.ndarray, g: np.ndarray) -> list[np.ndarray]:
    ga = g @ np.swapaxes(b, -1, -2)
    gb = np.swapaxes(a, -1, -2) @ g
    return [_unbroadcast(ga, a.shape), _unbroadcast(gb, b.shape)]


def _gemm_vjp(lo: LocalOp, g: np.ndarray) -> list[np.ndarray]:
    a, b = lo.inputs[0], lo.inputs[1]
    alpha, beta = lo.attrs.get("alpha", 1.0), lo.attrs.get("beta", 1.0)
    at = a.T if lo.attrs.get("transA", 0) else a
    bt = b.T if lo.attrs.get("transB", 0) else b
    ga, gb = alpha * (g @ bt.T), alpha * (at.T @ g)
    out = [ga.T if lo.attrs.get("transA", 0) else ga, gb.T if lo.attrs.get("transB", 0) else gb]
    if len(lo.inputs) > 2:
        out.append(beta * _unbroadcast(g, lo.inputs[2].shape))
    return out


def _local_vjp(lo: LocalOp, g: np.ndarray) -> list[np.ndarray]:
    """The gradients of an operator's data inputs on one device, from its output's gradient
    (numpy, float64)."""
    x, y = lo.inputs, lo.outputs[0]
    kind = lo.op_type
    if kind == "MatMul":
        return _matmul_vjp(x[0], x[1], g)
    if kind == "Gemm":
        return _gemm_vjp(lo, g)
    if kind == "Add":
        return [_unbroadcast(g, x[0].shape), _unbroadcast(g, x[1].shape)]
    if kind == "Sub":
        return [_unbroadcast(g, x[0].shape), _unbroadcast(-g, x[1].shape)]
    if kind == "Mul":
        return [_unbroadcast(g * x[1], x[0].shape), _unbroadcast(g * x[0], x[1].shape)]
    if kind == "Relu":
        return [g * (x[0] > 0)]
    if kind == "Tanh":
        return [g * (1 - y * y)]
    if kind == "Sigmoid":
        return [g * y * (1 - y)]
    return [g]  # Identity


def _attrs(node) -> dict:
    from onnx import helper  # heavy: onnx (a loaded model is at hand)

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def check_backward_ops(sm: ShardModel, has_backward: tuple[bool, ...]) -> None:
    """Refuse (one line) a model whose backward has an operator this emulation lacks."""
    for op, backward in zip(sm.ops, has_backward, strict=True):
        if backward and op.op_type not in BACKWARD_OPS:
            raise MtppError(
                f"--verify --training runs the backward of {', '.join(BACKWARD_OPS)} only; node "
                f"{op.name!r} is a {op.op_type}: verify without --training"
            )


def run_backward(planner: Planner, program: Program, trace: Trace, seeds: dict) -> dict:
    """The backward of ``program`` on emulated devices, from the output gradients ``seeds``
    (name -> global array): every gradient computed locally with the forward's splits, bias
    gradients on the bias's device only, partial sums reduced as the plan's collectives do.
    Returns weight name -> its global gradient."""
    sm, flow = planner.sm, planner.flow
    grads: dict[str, list[np.ndarray]] = {}
    for t, g in seeds.items():  # in the output's final layout, then back to its producer's
        lay = without_partial(program.layouts[t])
        reduced = program.output_redists.get(t)
        if reduced is None:
            grads[t] = scatter(g.astype(np.float64), lay)
            continue
        back = planner.redistribution(reduced.dst, lay, t)
        grads[t] = apply(back, scatter(g.astype(np.float64), reduced.dst))
    weights: dict[str, np.ndarray] = {}
    for v in reversed(range(len(sm.ops))):
        if not flow.has_backward[v]:
            continue
        op, sh = sm.ops[v], program.shardings[v]
        local = _device_gradients(planner, program, trace, v, grads)
        for k, t in enumerate(op.data_inputs):
            if t not in flow.needs_grad:
                continue
            bufs = [local[r][k] for r in range(planner.devices)]
            grad = gradient_layout(sh, k)
            if t in flow.trainable:
                r = planner.redistribution(grad, without_partial(grad), t)
                whole = assemble(apply(r, bufs), r.dst)
                weights[t] = weights.get(t, 0.0) + whole
                continue
            u = sm.producer[t]
            dst = without_partial(_producer_layout(program, sm, u, t))
            moved = apply(planner.redistribution(grad, dst, t), bufs)
            have = grads.get(t)
            grads[t] = moved if have is None else [a + b for a, b in zip(have, moved, strict=True)]
    return weights


def _producer_layout(program: Program, sm: ShardModel, u: int, t: str):
    """The layout operator ``u`` leaves its output ``t`` in."""
    return program.shardings[u].out_layouts[sm.ops[u].outputs.index(t)]


def _device_gradients(planner, program, trace: Trace, v: int, grads: dict) -> list[list]:
    """Per device, the local gradients of operator ``v``'s data inputs."""
    sm = planner.sm
    op, sh = sm.ops[v], program.shardings[v]
    t_out = op.outputs[0]
    attrs = _attrs(op.node)
    out = []
    for r in range(planner.devices):
        ins = [np.asarray(b[r], dtype=np.float64) for b in trace.inputs[v]]
        y = np.asarray(trace.env[t_out][r], dtype=np.float64)
        g = grads[t_out][r] if t_out in grads else np.zeros_like(y)
        lo = LocalOp(op.op_type, attrs, ins, [y])
        gs = _local_vjp(lo, g)
        if sh.kind == "bias_once" and len(gs) > 2 and sh.out_layouts[0].partial:
            c = sh.out_layouts[0].coords(r)
            if any(c[a] for a in sh.out_layouts[0].partial):
                gs[2] = np.zeros_like(gs[2])  # the bias was added on one partial-sum device
        out.append(gs)
    return out


@dataclass
class GradientCheck:
    """A weight's gradient from the split program against central differences of the whole
    model on onnxruntime, along random directions D: <grad, D> against (L(W + eD) -
    L(W - eD)) / 2e, L = sum over outputs of output x its random seed gradient."""

    weight: str
    analytic: float
    numerical: float

    @property
    def rel_error(self) -> float:
        scale = max(abs(self.analytic), abs(self.numerical), 1e-12)
        return abs(self.analytic - self.numerical) / scale


class _Loss:
    """The whole model on onnxruntime in float64, its trainable weights fed as inputs: the loss
    L for given weights (sum of output x seed). The operators ``BACKWARD_OPS`` names all run
    in float64, so central differences with a tiny step are exact to many digits."""

    def __init__(self, sm: ShardModel, trainable, feeds: dict, seeds: dict) -> None:
        import onnxruntime as ort  # heavy: onnxruntime

        m = _float64_model(sm.model, trainable)
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        self.sess = ort.InferenceSession(
            m.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        self.names = [o.name for o in self.sess.get_outputs()]
        self.feeds = {t: _widen(x) for t, x in feeds.items()}
        self.seeds = seeds

    def __call__(self, weights: dict[str, np.ndarray]) -> float:
        outs = self.sess.run(None, {**self.feeds, **{t: _widen(w) for t, w in weights.items()}})
        return math.fsum(
            float(np.sum(o * self.seeds[n]))
            for n, o in zip(self.names, outs, strict=True)
            if n in self.seeds
        )


def _widen(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) else x


def _float64_model(model, trainable):
    """A copy of ``model`` computing in float64, the ``trainable`` weights turned into inputs."""
    from onnx import TensorProto, helper, numpy_helper  # heavy: onnx

    m = type(model)()
    m.CopyFrom(model)
    g = m.graph
    for init in list(g.initializer):
        if init.data_type != TensorProto.FLOAT:
            continue
        value = numpy_helper.to_array(init).astype(np.float64)
        g.initializer.remove(init)
        if init.name in trainable:
            shape = list(value.shape)
            g.input.append(helper.make_tensor_value_info(init.name, TensorProto.DOUBLE, shape))
        else:
            g.initializer.append(numpy_helper.from_array(value, init.name))
    for info in [*g.input, *g.output, *g.value_info]:
        if info.type.tensor_type.elem_type == TensorProto.FLOAT:
            info.type.tensor_type.elem_type = TensorProto.DOUBLE
    return m


def gradient_checks(planner, grads: dict, loss: _Loss, seed: int) -> list[GradientCheck]:
    """Each weight's gradient along ``DIRECTIONS`` random directions against the numerical
    directional derivative of the whole model."""
    sm = planner.sm
    rng = np.random.default_rng(seed + 2)
    base = {t: np.asarray(sm.consts[t]) for t in planner.flow.trainable}
    checks = []
    for t in sorted(grads):
        w = base[t]
        for _ in range(DIRECTIONS):
            d = rng.standard_normal(w.shape)
            eps = STEP * max(1.0, float(np.abs(w).max()))
            plus = {**base, t: w.astype(np.float64) + eps * d}
            minus = {**base, t: w.astype(np.float64) - eps * d}
            numerical = (loss(plus) - loss(minus)) / (2 * eps)
            checks.append(GradientCheck(t, float(np.sum(grads[t] * d)), numerical))
    return checks


def verify_backward(planner: Planner, program: Program, seed: int = 0) -> dict:
    """The backward of a training plan on emulated devices against numerical gradients of the
    whole model on onnxruntime (random inputs, output gradients and directions, seeded)."""
    sm, flow = planner.sm, planner.flow
    check_backward_ops(sm, flow.has_backward)
    feeds = random_inputs(sm, seed)
    rng = np.random.default_rng(seed + 1)
    seeds = {t: rng.standard_normal(sm.shapes[t]) for t in sm.outputs if t in flow.needs_grad}
    try:
        trace = run_forward(planner, program, feeds)
        grads = run_backward(planner, program, trace, seeds)
    except ValueError as e:  # a replica that differs, a shape that does not fit: a wrong program
        return {"ok": False, "weights": 0, "max_rel_error": math.inf, "error": first_line(e)}
    checks = gradient_checks(planner, grads, _Loss(sm, flow.trainable, feeds, seeds), seed)
    worst = max(checks, key=lambda c: c.rel_error, default=None)
    ok = worst is None or worst.rel_error <= GRADIENT_TOLERANCE
    report = {"ok": ok, "weights": len(grads), "max_rel_error": worst.rel_error if worst else 0.0}
    if not ok:
        report["error"] = (
            f"the gradient of {worst.weight!r} differs: {worst.analytic:.6g} along a random "
            f"direction, numerically {worst.numerical:.6g}"
        )
    return report
