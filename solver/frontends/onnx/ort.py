"""Running an ONNX model in onnxruntime: sessions on models with external data, random inputs,
a memory estimate before a run (weights counted as onnxruntime holds them), and the shapes of
every intermediate tensor from one run.

A session is built from the in-memory protobuf (which holds no weight bytes when the weights
are external) and told the folder its external data lives in, so onnxruntime reads the weights
itself, by their relative locations, and Python never holds them.
"""

from __future__ import annotations

import os

import numpy as np

from solver.core.errors import MtppError, first_line
from solver.core.units import format_bytes
from solver.frontends.onnx.common import dense_bytes, dtype_bytes, external_info, model_tensors
from solver.frontends.onnx.flops import numel

MAX_ARRAY_BYTES = 2**62  # past this numpy refuses the shape itself (with --memory-ok)


def check_input_size(name: str, shape, dtype) -> None:
    """Refuse a random input no machine can hold before numpy is asked for it (numpy would
    raise "array is too big", a ValueError, past :data:`MAX_ARRAY_BYTES`)."""
    size = np.dtype(dtype).itemsize
    for d in shape:
        size *= max(int(d), 0)
    if size > MAX_ARRAY_BYTES:
        raise MtppError(
            f"input {name!r} of shape {list(shape)} would take {format_bytes(size)}, more "
            "than any machine can hold; use smaller --dim values"
        )


def random_inputs(model, shapes_by_name: dict[str, tuple[int, ...]] | None = None, seed: int = 0):
    """Seeded random feeds for every real graph input, with dims as fixed in ``model``."""
    from onnx import helper  # heavy: onnx

    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        if shapes_by_name and inp.name in shapes_by_name:
            shape = list(shapes_by_name[inp.name])
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        check_input_size(inp.name, shape, dt)
        if np.issubdtype(dt, np.floating):
            feeds[inp.name] = rng.standard_normal(shape).astype(dt)
        elif dt == np.bool_:
            feeds[inp.name] = rng.random(shape) < 0.5
        else:  # ids and masks: small non-negative integers are valid for embeddings
            feeds[inp.name] = rng.integers(0, 2, shape).astype(dt)
    return feeds


def session(model, folder, so=None, what: str = "run the model"):
    """An onnxruntime CPU session on ``model`` (a ModelProto) whose external data, if any, is
    read by onnxruntime from ``folder`` (the model file's folder)."""
    import onnxruntime as ort  # heavy: onnxruntime

    so = so or ort.SessionOptions()
    so.log_severity_level = 3
    if folder is not None:
        so.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(folder)
        )
    try:
        return ort.InferenceSession(
            model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
    except Exception as e:  # onnxruntime raises its own exception types
        raise MtppError(f"onnxruntime cannot {what}: {first_line(e)}") from None


def available_memory() -> int:
    """Bytes of memory available to a new allocation (MemAvailable on Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: do not refuse


def external_range(t) -> tuple[str, int, int]:
    """(location, offset, length) of an external tensor (already checked by
    :func:`solver.frontends.onnx.load.check_external_paths`)."""
    info = external_info(t)
    length = int(info["length"]) if "length" in info else dense_bytes(t)
    return info["location"], int(info.get("offset", "0")), length


def tensor_bytes(t) -> int:
    """Bytes of one tensor's data, external or inline, without reading it."""
    from onnx import TensorProto  # heavy: onnx

    return external_range(t)[2] if t.data_location == TensorProto.EXTERNAL else dense_bytes(t)


def held_bytes(t) -> int:
    """Bytes onnxruntime's CPU provider holds for one weight: fp16 and bf16 count twice, since
    it lacks fp16 kernels for most ops and computes in fp32 behind inserted casts (measured: a
    642 MiB fp16 Llama held 1.34 GiB of resident memory once its session was built)."""
    from onnx import TensorProto  # heavy: onnx

    wide = t.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16)
    return tensor_bytes(t) * (2 if wide else 1)


def weight_bytes(model) -> tuple[float, float]:
    """(stored, held) bytes of every weight of ``model`` (graph, subgraphs, functions), read
    from the protos only: what the files hold, and what a session holds (:func:`held_bytes`)."""
    tensors = list(model_tensors(model))
    return float(sum(map(tensor_bytes, tensors))), float(sum(map(held_bytes, tensors)))


def weights_detail(stored: float, held: float) -> str:
    """How the weights enter a memory estimate, for the message of a refusal."""
    text = f"weights {format_bytes(held)}"
    if held != stored:
        text += f", fp16 held as fp32, of {format_bytes(stored)} stored"
    return text


def check_memory(needed: float, what: str, detail: str, fix: str) -> None:
    """Refuse (one line, exit 2) when ``needed`` bytes exceed the memory available now."""
    avail = available_memory()
    if needed > avail:
        raise MtppError(
            f"{what} needs about {format_bytes(needed)} of memory ({detail}) but "
            f"{format_bytes(avail)} is available; {fix}"
        )


def run_shapes(model, folder, shapes) -> dict[str, tuple[tuple[int, ...], int]]:
    """Shapes of every top-level tensor from one onnxruntime run on seeded random inputs, with
    every intermediate tensor added as a graph output. ``shapes`` (what inference knows) gives
    the memory estimate checked first: all intermediates stay alive in such a run."""
    import onnx  # heavy: onnx
    from onnx import TensorProto, helper

    g = model.graph
    known = 0.0
    for shape, et in shapes.values():
        if shape is not None:
            known += numel(shape) * dtype_bytes(et)
    check_memory(
        known,
        "running the model once in onnxruntime to find tensor shapes",
        "at least every tensor of known shape, kept alive",
        "use smaller --dim values",
    )
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    outputs = {o.name for o in g.output}
    for node in g.node:
        for o in node.output:
            if o and o not in outputs:
                outputs.add(o)
                probe.graph.output.append(helper.make_empty_tensor_value_info(o))
    # value_info from a partial inference may clash with what the run produces: let ORT decide
    del probe.graph.value_info[:]
    sess = session(probe, folder, what="run the model to find the tensor shapes inference left")
    names = [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, random_inputs(model))
    except Exception as e:  # onnxruntime raises its own exception types
        raise MtppError(
            "onnxruntime cannot run the model to find the tensor shapes inference left: "
            + first_line(e)
        ) from None
    out: dict[str, tuple[tuple[int, ...], int]] = {}
    for name, v in zip(names, values, strict=True):
        if isinstance(v, np.ndarray):
            obj = v.dtype == object
            et = TensorProto.STRING if obj else helper.np_dtype_to_tensor_dtype(v.dtype)
            out[name] = (tuple(int(d) for d in v.shape), int(et))
    return out


def activation_peak(g) -> float:
    """Bytes of activations alive at once when the cost graph runs in topological order, each
    tensor from its producer to its last consumer (model inputs included)."""
    pos = g.topo_rank
    start = pos[g.t_producer]
    end = start.copy()
    if len(g.t_cons):
        np.maximum.at(end, g.pair_tensor, pos[g.t_cons])
    delta = np.zeros(g.n + 1)
    np.add.at(delta, start, g.t_size)
    np.add.at(delta, end + 1, -g.t_size)
    return float(np.cumsum(delta)[:-1].max()) if g.n else 0.0
