"""Every numeric check of an exported or sharded model, in one place.

- Pipeline stage models (``mtpp export --verify`` of a pipeline plan): :func:`verify_stages`
  runs the original model and the chained ``stage{s}.onnx`` files in onnxruntime on the same
  seeded random inputs and compares every model output (:func:`compare_output`), each held to
  the tolerance given or to the default of its ONNX element type (:func:`elem_tolerance`).
- Sharded programs (``mtpp shard --verify``): :func:`verify` runs the program on emulated
  devices (:mod:`solver.backends.spmd_execute`) and compares its outputs with onnxruntime on
  the whole model (:func:`compare`, by default held to :func:`default_tolerance`).
- Joint plans (``mtpp export --verify`` of a joint plan): :func:`verify_chain` runs the stages
  one after the other on emulated devices and compares every boundary tensor and model output;
  :func:`verify_memory` estimates what that needs.

Execution lives in :mod:`solver.backends.spmd_execute` and is reached through the module
(``spmd_execute.run_sharded``), so a test that replaces it there reaches these checks too.
The writers (:mod:`solver.backends.export`, :mod:`solver.backends.export_joint`) call these
checks on the folder they are writing, before it is renamed into place.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from solver.backends import spmd_execute
from solver.core.errors import MtppError, first_line
from solver.frontends.onnx.ort import random_inputs as onnx_random_inputs
from solver.spmd.model import ShardModel, Unloaded
from solver.spmd.program import Planner, Program

# ---------------------------------------------------------------------- pipeline stage models
# default --tolerance by ONNX output type: fp32/fp64 sessions agree to rounding; fp16/bf16
# stage and full sessions fuse (and cast) ops differently, a few fp16 ulps (measured 2.4e-4)
FLOAT_TOLERANCE = 1e-4
HALF_TOLERANCE = 1e-2


def elem_tolerance(elem_type: int) -> float:
    """Largest absolute difference allowed on an output of this ONNX element type when the user
    gives no ``--tolerance``: 1e-4 for float32/float64 (and complex), 1e-2 for float16/bfloat16,
    0 (exact) for integers, bools, strings and the 8-bit floats."""
    from onnx import TensorProto  # heavy: onnx

    if elem_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
        return HALF_TOLERANCE
    if elem_type in (
        TensorProto.FLOAT,
        TensorProto.DOUBLE,
        TensorProto.COMPLEX64,
        TensorProto.COMPLEX128,
    ):
        return FLOAT_TOLERANCE
    return 0.0


def _elem_type(model, name: str, value: np.ndarray) -> int:
    """ONNX element type of a model output: as declared, else from the value onnxruntime gave."""
    from onnx import helper  # heavy: onnx

    for o in model.graph.output:
        if o.name == name and o.type.tensor_type.elem_type:
            return int(o.type.tensor_type.elem_type)
    try:
        return int(helper.np_dtype_to_tensor_dtype(value.dtype))
    except (KeyError, TypeError, ValueError):
        return 0  # a type onnx does not name: compared exactly


def _run_stages(model_path: Path, model, folder: Path, report: dict, seed: int):
    """The original model's outputs and every tensor the chained stages computed (inputs
    included), on the same seeded random inputs; one session in memory at a time."""
    import onnxruntime as ort  # heavy: onnxruntime

    so = ort.SessionOptions()
    so.log_severity_level = 3
    feeds = onnx_random_inputs(model, seed=seed)
    full = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in full.get_outputs()], full.run(None, feeds), strict=True))
    del full  # one model in memory at a time (see export.memory_estimate)
    env = dict(feeds)
    for st in report["stages"]:
        if not st["file"]:
            continue
        sess = ort.InferenceSession(
            str(folder / st["file"]), so, providers=["CPUExecutionProvider"]
        )
        outs = sess.run(st["outputs"], {x: env[x] for x in st["inputs"]})
        del sess
        env.update(zip(st["outputs"], outs, strict=True))
    return want, env


def verify_stages(
    model_path: Path, model, folder: Path, report: dict, tolerance: float | None, seed: int
) -> dict:
    """Run the original and the chained stages on the same random inputs; compare outputs.

    Every output is held to ``tolerance`` or, when it is None, to the default of its element
    type (:func:`elem_tolerance`); the report names the tolerance used per output.
    """
    want, env = _run_stages(model_path, model, folder, report, seed)
    diffs: dict[str, float | None] = {}
    tols: dict[str, float] = {}
    problems: list[str] = []
    for name, ref in want.items():
        if name not in env:
            raise MtppError(f"verify: no stage produces the model output {name!r}")
        ref = np.asarray(ref)
        tols[name] = (
            tolerance if tolerance is not None else elem_tolerance(_elem_type(model, name, ref))
        )
        diffs[name], problem = compare_output(name, ref, np.asarray(env[name]))
        if problem:
            problems.append(problem)
    over = [x for x, d in diffs.items() if d is not None and d > tols[x]]
    compared = [d for d in diffs.values() if d is not None]
    worst = max(compared) if compared else None  # None: no output could be compared
    return {
        "max_abs_diff": worst,
        "per_output": diffs,
        "problems": problems,
        "tolerance": tolerance,  # None: each output's default, in tolerance_per_output
        "tolerance_per_output": tols,
        "over_tolerance": over,  # outputs whose difference exceeds their tolerance
        "ok": not problems and not over,
        "seed": seed,
    }


def compare_output(name: str, ref: np.ndarray, got: np.ndarray) -> tuple[float | None, str | None]:
    """Largest absolute difference of one model output, or None and the reason it cannot pass.

    Shapes and kinds of dtype (float, int, bool, ...) must agree before values are compared
    (broadcasting would hide a wrong shape), and a NaN on either side is a failure, never a
    pass: NaN compares unequal to everything, so a max over differences would drop it.
    """
    if ref.shape != got.shape:
        return None, f"{name}: shape {list(got.shape)} from the stages, {list(ref.shape)} expected"
    if ref.dtype.kind != got.dtype.kind:
        return None, f"{name}: dtype {got.dtype} from the stages, {ref.dtype} expected"
    if ref.dtype.kind in "fc":
        for side, x in (("original model", ref), ("stages", got)):
            if np.isnan(x).any():
                return None, f"{name}: the {side} output has NaN"
        if not np.array_equal(np.isinf(ref), np.isinf(got)) or not np.array_equal(
            ref[np.isinf(ref)], got[np.isinf(got)]
        ):
            return None, f"{name}: infinities differ between the original and the stages"
        fin = np.isfinite(ref)
        diff = np.abs(got[fin].astype(np.float64) - ref[fin].astype(np.float64))
        return (float(diff.max()) if diff.size else 0.0), None
    if ref.dtype.kind in "iub":
        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        return (float(diff.max()) if diff.size else 0.0), None
    if np.array_equal(ref, got):
        return 0.0, None
    return None, f"{name}: values differ"


# ---------------------------------------------------------------------- sharded programs
REL_TOLERANCE = 1e-4  # as mtpp shard --verify: max abs diff <= 1e-4 * max(1, max |reference|)
# fp16/bf16: the emulated devices and onnxruntime sum in different orders, a few half-precision
# ulps apart (measured 4.9e-4 on a random-weight Llama); the pipeline exporter allows 1e-2 too
HALF_REL_TOLERANCE = 1e-2


def default_tolerance(want: np.ndarray, scale: float) -> float:
    """The tolerance of a tensor when none is given, by its type: ``1e-4 * max(1, scale)`` for
    float32/float64, ``1e-2 * max(1, scale)`` for float16/bfloat16, exact (0) for integers and
    booleans, as ``mtpp export --verify`` of pipeline plans holds its outputs."""
    dtype = np.asarray(want).dtype
    if dtype.name in ("float16", "bfloat16"):
        return HALF_REL_TOLERANCE * max(1.0, scale)
    if dtype.kind in "iub":
        return 0.0
    return REL_TOLERANCE * max(1.0, scale)


def compare(want: np.ndarray, have: np.ndarray, tolerance: float | None) -> dict:
    """Shapes, NaN, max abs and max relative difference of one tensor, and whether it passes:
    abs diff <= ``tolerance``, or by default as :func:`default_tolerance` says."""
    have = np.asarray(have)
    same = tuple(have.shape) == tuple(want.shape)
    nan = bool(np.isnan(have).any()) if np.issubdtype(have.dtype, np.floating) else False
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    diff = math.inf
    if same:
        diff = float(np.max(np.abs(have.astype(np.float64) - want))) if want.size else 0.0
    tol = tolerance if tolerance is not None else default_tolerance(want, scale)
    ok = same and not nan and diff <= tol
    return {
        "shape": list(have.shape),
        "max_abs_diff": diff if math.isfinite(diff) else None,
        "max_rel_diff": (diff / scale if scale > 0 else diff) if math.isfinite(diff) else None,
        "tolerance": tol,
        "nan": nan,
        "ok": bool(ok),
    }


def _needs_weights(sm: ShardModel) -> None:
    """Refuse a check whose model's external weight file is absent."""
    if any(isinstance(v, Unloaded) for v in sm.consts.values()):
        raise MtppError(
            "--verify needs the weights, but the model's external weight file is absent"
        )


def verify(
    planner: Planner, program: Program, seed: int = 0, tolerance: float | None = None
) -> dict:
    """Sharded vs unsplit on seeded random inputs: shapes equal, no NaN, max abs diff within
    ``tolerance``, by default per output type as :func:`default_tolerance`
    (fp32 1e-4, fp16/bf16 1e-2, times max(1, max |reference|); integers and bools exact).
    A program that cannot run fails with the reason in ``error``."""
    _needs_weights(planner.sm)
    feeds = spmd_execute.random_inputs(planner.sm, seed)
    ref = spmd_execute.reference(planner.sm, feeds)
    try:
        got = spmd_execute.run_sharded(planner, program, feeds)
    except ValueError as e:  # a replica mismatch or a block no device holds
        return {"ok": False, "max_abs_diff": None, "error": str(e), "outputs": {}}
    per = {t: compare(want, got[t], tolerance) for t, want in ref.items()}
    diffs = [c["max_abs_diff"] for c in per.values()]
    worst = None if None in diffs else max(diffs, default=0.0)
    bad = next((t for t, c in per.items() if not c["ok"]), None)
    out = {"ok": bad is None, "max_abs_diff": worst, "seed": seed, "outputs": per}
    if bad is not None:
        out["error"] = f"output {bad!r}: {_why_output(per[bad])}"
    return out


def _why_output(c: dict) -> str:
    """Why an output failed the comparison, in a few words."""
    if c["max_abs_diff"] is None:
        return f"shape {c['shape']} differs from the reference's"
    if c["nan"]:
        return "has NaN"
    return f"max abs diff {c['max_abs_diff']:.3g} exceeds the tolerance {c['tolerance']:.3g}"


# ---------------------------------------------------------------------- joint plans
class StageRun(Protocol):
    """A stage ready to run on its emulated devices (what
    :class:`solver.joint.stages.StageProgram` holds)."""

    stage: Any  # the joint plan's stage: index, inputs, outputs
    planner: Planner
    program: Program


def _reference(sm: ShardModel, names: list[str], feeds: dict) -> dict[str, np.ndarray]:
    """onnxruntime on the whole model, returning ``names`` (outputs and inner tensors)."""
    import onnxruntime as ort  # heavy: onnxruntime
    from onnx import helper  # heavy: onnx

    m = type(sm.model)()
    m.CopyFrom(sm.model)
    have = {o.name for o in m.graph.output}
    for x in names:
        if x not in have:
            elem = helper.np_dtype_to_tensor_dtype(sm.dtypes[x])
            m.graph.output.append(helper.make_tensor_value_info(x, elem, list(sm.shapes[x])))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return dict(zip(names, sess.run(names, feeds), strict=True))


def verify_chain(
    plan, sm: ShardModel, programs: list[StageRun], seed: int = 0, tolerance=None
) -> dict:
    """Run the stages one after the other on emulated devices, each fed by the outputs of the
    stages before it, and compare every boundary tensor and model output with onnxruntime."""
    _needs_weights(sm)
    feeds = spmd_execute.random_inputs(sm, seed)
    inner = [x for p in programs for x in p.stage.outputs]
    names = list(dict.fromkeys([*sm.outputs, *inner]))
    ref = _reference(sm, names, feeds)
    env: dict[str, np.ndarray] = dict(feeds)
    stages, failure = [], None
    for p in programs:
        st = p.stage
        row = {"stage": st.index, "outputs": {}, "error": None}
        stages.append(row)
        try:
            got = spmd_execute.run_sharded(p.planner, p.program, {x: env[x] for x in st.inputs})
        except ValueError as e:  # a replica mismatch, a shard of the wrong shape
            row["error"] = first_line(e)
            failure = failure or f"stage {st.index}: {row['error']}"
            break
        for x in st.outputs:
            env[x] = got[x]
            row["outputs"][x] = c = compare(ref[x], got[x], tolerance)
            if not c["ok"] and failure is None:
                failure = f"stage {st.index}, tensor {x!r}: " + _why_stage(c)
    outputs = {x: compare(ref[x], env[x], tolerance) for x in sm.outputs if x in env}
    for x in sm.outputs:
        if x not in env and failure is None:
            failure = f"model output {x!r} was not computed by any stage"
    worst = [c["max_abs_diff"] for c in outputs.values()]
    return {
        "ok": failure is None and all(c["ok"] for c in outputs.values()),
        "seed": seed,
        "tolerance": tolerance,
        "max_abs_diff": None if None in worst or not worst else max(worst),
        "outputs": outputs,
        "stages": stages,
        "failure": failure,
    }


def _why_stage(c: dict) -> str:
    """Why a stage's tensor failed the comparison, in a few words."""
    if c["max_abs_diff"] is None:
        return f"shape {c['shape']} differs from the model's"
    if c["nan"]:
        return "NaN in the stage's result"
    return f"max abs diff {c['max_abs_diff']:.3g} exceeds the tolerance {c['tolerance']:.3g}"


def verify_memory(sm: ShardModel, programs: list[StageRun]) -> float:
    """Bytes ``--verify`` needs beyond the loaded model, an estimate: the weights twice (the
    reference session, the stages loaded back), every activation of the whole model (the
    reference returns every boundary tensor) and the busiest stage's devices, each holding
    its program's memory."""
    weights = sum(np.asarray(v).nbytes for v in sm.consts.values() if not isinstance(v, Unloaded))
    acts = sum(math.prod(sm.shapes[t]) * sm.itemsize(t) for op in sm.ops for t in op.outputs)
    devices = max(p.program.memory_per_device * p.planner.devices for p in programs)
    return float(2 * weights + acts + devices)
