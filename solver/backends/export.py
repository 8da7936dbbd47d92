"""Write a plan as a sharded ONNX model, and prove it computes what the original did.

Output folder (written to a temporary folder beside it and renamed into place, so an
interrupted export leaves nothing half-written; an existing non-empty folder is replaced only
with ``force``, and only after the new one is complete):

- ``annotated.onnx``: the full model with the int attributes ``__ipu_number`` (device) and
  ``__pipeline_stage`` (stage) on every node, as PopART and PopRT expect;
- ``stage{s}.onnx``: one model per non-empty stage with explicit boundary tensors. Inputs are
  tensors from earlier stages or model inputs; outputs are what later stages or the model's
  outputs need. Constant subgraphs are replicated into every stage that reads them;
- ``stage{s}.onnx.data``: when the original kept weights in external data, the byte ranges
  stage ``s`` needs, copied from the original data file(s) in chunks by the kernel, skipping
  holes (a sparse file stays sparse). ``annotated.onnx`` references these same files (and
  ``annotated.onnx.data`` for weights no stage reads), so the weights are stored once per
  stage, never read into Python, and every location stays inside the folder, as onnxruntime
  requires. Weights stored inline stay inline;
- ``sharding.yaml``: the plan as PopRT-style manual sharding points, which ``--method manual``
  reads back to the same plan;
- ``stages.json``: stage inputs/outputs, the memory estimate and, with ``verify``, the result.

The model is loaded without its external data and checked by path (the in-memory checker and
protobuf stop at 2 GiB), so peak memory follows the size of the graph, not of the weights.

``verify`` (:func:`solver.backends.verify.verify_stages`) runs the original model and the
chained stage models in onnxruntime on seeded random inputs, checks that every model output
has the original's shape and kind of dtype, and reports the largest absolute difference, held
per output to the tolerance given or to the default of its type (1e-4 for float32/float64,
1e-2 for float16/bfloat16, exact for integers and bools); a NaN in either output fails the
check. It needs about the model's weights plus activations in memory (:func:`memory_estimate`)
and refuses when that exceeds the memory available, unless ``verify_memory_ok``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from solver.backends.verify import verify_stages
from solver.core.errors import MtppError, first_line
from solver.core.files import check_output_dir
from solver.core.graph import Graph, induced_subgraph
from solver.core.outdir import replace_dir, temp_dir_beside
from solver.core.units import format_bytes
from solver.frontends.onnx.common import (
    CONTROL_FLOW,
    dtype_bytes,
    graph_tensors,
    model_tensors,
    node_names,
    node_tensors,
    subgraph_inputs,
    subgraphs,
)
from solver.frontends.onnx.flops import numel
from solver.frontends.onnx.load import check_external_paths
from solver.frontends.onnx.ort import (
    activation_peak,
    check_memory,
    external_range,
    held_bytes,
    weight_bytes,
    weights_detail,
)
from solver.frontends.onnx.shapes import complete_shapes, fix_dims
from solver.frontends.sharding_points import to_sharding_yaml

ALIGN = 4096  # offsets of copied tensors, so that onnxruntime may map them page by page
CHUNK = 64 << 20  # bytes per copy call
MAX_OPEN = 64  # source data files kept open at once


def onnx_placement(model, g: Graph, assignment: np.ndarray) -> tuple[list[int], set[int]]:
    """Device of every ONNX node, and the indices of the static (replicable) ones.

    Operators and views take the block of the cost node they were folded into; static
    (constant) nodes take the smallest device among their readers, so the annotated model
    never sends a tensor backwards.
    """
    names = node_names(model)
    members = g.hints.get("members")
    if members is None:
        raise MtppError(
            "export needs a graph imported from ONNX (the plan's graph has no ONNX node mapping)"
        )
    static_names = set(g.hints.get("static_nodes", []))
    device_of = {}
    for cost_name, onnx_names in members.items():
        d = int(assignment[g.index[cost_name]])
        for nm in onnx_names:
            if nm not in static_names:
                device_of[nm] = d
    static = {i for i, nm in enumerate(names) if nm in static_names or nm not in device_of}
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(model.graph.node):
        for x in node.input:
            if x:
                readers.setdefault(x, []).append(i)
    dev = [device_of.get(nm, -1) for nm in names]
    for i in reversed(range(len(names))):  # statics: the earliest device that reads them
        if i in static:
            ds = [
                dev[j]
                for o in model.graph.node[i].output
                for j in readers.get(o, [])
                if dev[j] >= 0
            ]
            dev[i] = min(ds) if ds else 0
    return dev, static


def _value_info(name: str, shapes) -> object:
    from onnx import helper

    shape, et = shapes.get(name, (None, 1))
    return helper.make_tensor_value_info(name, et or 1, list(shape) if shape is not None else None)


def stage_models(model, dev: list[int], static: set[int], shapes, k: int) -> list[dict]:
    """For every stage: the node indices (statics replicated), inputs, outputs, initializers."""
    g = model.graph
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    inits = {t.name for t in g.initializer}
    graph_inputs = {i.name for i in g.input if i.name not in inits}
    graph_outputs = [o.name for o in g.output]
    reads = [_reads(node) for node in g.node]
    need_later = _sent_later(g, dev, static, producer, reads)
    stages = []
    for s in range(k):
        own = [i for i in range(len(g.node)) if i not in static and dev[i] == s]
        if not own:
            stages.append({"stage": s, "nodes": [], "inputs": [], "outputs": [], "inits": []})
            continue
        take, todo = set(own), list(own)
        inputs, used_inits = [], set()
        while todo:
            i = todo.pop()
            for x in reads[i]:
                p = producer.get(x)
                if x in inits:
                    used_inits.add(x)
                elif p is not None and p in static:
                    if p not in take:
                        take.add(p)
                        todo.append(p)
                elif x not in inputs and (
                    (p is None and x in graph_inputs) or (p is not None and dev[p] != s)
                ):
                    inputs.append(x)
        produced = {o for i in own for o in g.node[i].output if o}
        outputs = [x for x in produced if need_later.get(x) or x in graph_outputs]
        outputs.sort(key=lambda x: (x not in graph_outputs, x))
        stages.append(
            {
                "stage": s,
                "nodes": sorted(take),
                "inputs": inputs,
                "outputs": outputs,
                "inits": sorted(used_inits),
            }
        )
    return stages


def _reads(node) -> list[str]:
    """The tensors a node reads: its inputs, and for control flow its bodies' outer names."""
    xs = [x for x in node.input if x]
    if node.op_type in CONTROL_FLOW:
        xs += [x for x in subgraph_inputs(node) if x not in xs]
    return xs


def _sent_later(g, dev: list[int], static: set[int], producer: dict, reads: list) -> dict:
    """Tensor -> the later devices that read it; refuses a node reading from a later device."""
    need_later: dict[str, set[int]] = {}
    for i, node in enumerate(g.node):
        if i in static:
            continue
        for x in reads[i]:
            p = producer.get(x)
            if p is not None and p not in static and dev[p] != dev[i]:
                if dev[p] > dev[i]:
                    raise MtppError(
                        f"node {node.name or i!r} on device {dev[i]} reads {x!r} from the "
                        f"later device {dev[p]}: the plan does not respect the graph order"
                    )
                need_later.setdefault(x, set()).add(dev[i])
    return need_later


def _build_stage(model, st: dict, shapes):
    """The stage model, built from the node and initializer protos of ``model``: external
    tensors still point at the original data (their bytes are never loaded)."""
    from onnx import helper

    g = model.graph
    init_by_name = {t.name: t for t in g.initializer}
    graph = helper.make_graph(
        [g.node[i] for i in st["nodes"]],
        f"{g.name or 'model'}_stage{st['stage']}",
        [_value_info(x, shapes) for x in st["inputs"]],
        [_value_info(x, shapes) for x in st["outputs"]],
        initializer=[init_by_name[x] for x in st["inits"]],
    )
    m = helper.make_model(graph, opset_imports=list(model.opset_import))
    m.ir_version = max(model.ir_version, 4)  # IR < 4 needs every initializer as an input
    m.functions.extend(model.functions)
    return m


# ---------------------------------------------------------------------- external data, by copy
def copy_range(src: int, dst: int, src_off: int, dst_off: int, length: int) -> int:
    """Copy ``length`` bytes between open files, skipping the holes of the source (found with
    SEEK_DATA / SEEK_HOLE), so that a sparse source stays sparse; returns the bytes copied.

    The data goes through ``os.copy_file_range`` (in the kernel, a reflink where the file
    system can), else through a ``CHUNK``-sized buffer: memory stays bounded by one chunk.
    """
    end, pos, copied = src_off + length, src_off, 0
    while pos < end:
        try:
            data = os.lseek(src, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole up to the end of the file
                break
            data = pos  # no SEEK_DATA here: treat everything as data
        if data >= end:
            break
        try:
            hole = os.lseek(src, data, os.SEEK_HOLE)
        except OSError:
            hole = end
        stop = min(max(hole, data + 1), end)
        _copy_bytes(src, dst, data, dst_off + (data - src_off), stop - data)
        copied += stop - data
        pos = stop
    return copied


_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.ETXTBSY}


def _copy_bytes(src: int, dst: int, s: int, d: int, n: int) -> None:
    kernel = hasattr(os, "copy_file_range")
    while n > 0:
        step = min(n, CHUNK)
        done = 0
        if kernel:
            try:
                done = os.copy_file_range(src, dst, step, s, d)
            except OSError as e:
                if e.errno not in _NO_KERNEL_COPY:
                    raise
                kernel = False  # another file system, or not supported: copy by buffer
        if not kernel:
            buf = os.pread(src, step, s)
            done = os.pwrite(dst, buf, d) if buf else 0
        if done <= 0:
            raise MtppError(
                "an external data file ended early while copying weights; it changed during "
                "the export"
            )
        s, d, n = s + done, d + done, n - done


class DataFiles:
    """The data files of one export: each tensor range copied once per output file.

    ``add`` copies one source range into a named output file (created on first use) at the
    next ``ALIGN``-ed offset and returns that offset; ``where`` says where a range already is.
    """

    def __init__(self, src_dir: Path, out_dir: Path):
        self.src_dir, self.out_dir = src_dir, out_dir
        self.src: dict[str, int] = {}
        self.dst: dict[str, list[int]] = {}  # name -> [fd, end]
        self.placed: dict[tuple[str, int, int], dict[str, int]] = {}
        self.copied = 0

    def add(self, name: str, key: tuple[str, int, int]) -> int:
        at = self.placed.setdefault(key, {})
        if name in at:
            return at[name]
        loc, offset, length = key
        if loc not in self.src:
            if len(self.src) >= MAX_OPEN:  # one file per tensor (onnx's default): few fds
                for fd in self.src.values():
                    os.close(fd)
                self.src = {}
            self.src[loc] = os.open(self.src_dir / loc, os.O_RDONLY)
        if name not in self.dst:
            fd = os.open(self.out_dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            self.dst[name] = [fd, 0]
        fd, end = self.dst[name]
        pos = -(-end // ALIGN) * ALIGN
        self.copied += copy_range(self.src[loc], fd, offset, pos, length)
        self.dst[name][1] = pos + length
        at[name] = pos
        return pos

    def where(self, key: tuple[str, int, int]) -> tuple[str, int] | None:
        for name, pos in self.placed.get(key, {}).items():
            return name, pos
        return None

    def close(self) -> None:
        """Give every output file its full size (a trailing hole stays a hole), close all."""
        for fd, end in self.dst.values():
            try:
                os.ftruncate(fd, end)
            finally:
                os.close(fd)
        for fd in self.src.values():
            os.close(fd)
        self.src, self.dst = {}, {}


def _point(t, location: str, offset: int, length: int) -> None:
    del t.external_data[:]
    for key, val in (("location", location), ("offset", offset), ("length", length)):
        t.external_data.add(key=key, value=str(val))


def write_model(m, path: Path, data: DataFiles, reuse: bool) -> None:
    """Save ``m`` at ``path`` with every external tensor moved into the folder: copied into
    ``<name>.data``, or, with ``reuse``, pointed at a copy another file of the folder holds.
    Then run the ONNX checker on the saved file (by path: external data and > 2 GiB work)."""
    import onnx
    from onnx import TensorProto

    own = path.name + ".data"
    try:
        for t in model_tensors(m):
            if t.data_location != TensorProto.EXTERNAL:
                continue
            key = external_range(t)
            found = data.where(key) if reuse else None
            name, pos = found if found else (own, data.add(own, key))
            _point(t, name, pos, key[2])
        path.write_bytes(m.SerializeToString())
    except OSError as e:  # a full disk, a quota: the user's to fix, not a crash
        raise MtppError(
            f"export: cannot write {path.name} or its data in {path.parent.parent}: "
            f"{e.strerror or e}"
        ) from None
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as e:
        first = first_line(e, "invalid model")
        raise MtppError(f"export: the ONNX checker rejects {path.name}: {first}") from None


# ---------------------------------------------------------------------- memory
def _bytes_of(names, shapes) -> float:
    total = 0.0
    for x in names:
        shape, et = shapes.get(x, (None, 1))
        if shape is not None:
            total += numel(shape) * dtype_bytes(et or 1)
    return total


def memory_estimate(model, g: Graph, a: np.ndarray, stages: list[dict], shapes) -> dict:
    """Bytes of memory a verify and a pipelined run need (an estimate, not a bound).

    Weights are counted from the protos without reading them, as onnxruntime holds them
    (:func:`solver.frontends.onnx.ort.held_bytes`). Activations: the liveness peak of
    the cost graph in topological order (:func:`solver.frontends.onnx.ort.activation_peak`) for the
    whole model, and per stage that of its nodes plus its boundary tensors. ``verify`` runs the
    full model, then the stages one at a time holding every boundary tensor; ``run`` holds
    every stage at once (one process each) plus the requests in flight, then the full model.
    """
    gr = model.graph
    init_by_name = {t.name: t for t in gr.initializer}
    stored, weights = weight_bytes(model)
    act_full = activation_peak(g)
    per_stage = []
    boundary = _bytes_of({x for st in stages for x in st["outputs"]}, shapes)
    for st in stages:
        if not st["nodes"]:
            continue
        w = sum(held_bytes(init_by_name[x]) for x in st["inits"])
        for i in st["nodes"]:
            node = gr.node[i]
            w += sum(held_bytes(t) for t in node_tensors(node))
            w += sum(held_bytes(t) for sub in subgraphs(node) for t in graph_tensors(sub))
        nodes = np.flatnonzero(a == st["stage"])
        act = activation_peak(induced_subgraph(g, nodes)) if len(nodes) else 0.0
        act += _bytes_of(st["inputs"], shapes) + _bytes_of(st["outputs"], shapes)
        per_stage.append({"stage": st["stage"], "weights": float(w), "activations": act})
    feeds = _bytes_of([i.name for i in gr.input if i.name not in init_by_name], shapes)
    full = weights + act_full
    chained = max((s["weights"] + s["activations"] for s in per_stage), default=0.0)
    in_flight = (4 * len(per_stage) + 4) * (feeds + boundary)  # solver.backends.run's window
    pipeline = sum(s["weights"] + s["activations"] for s in per_stage) + in_flight
    return {
        "weights_stored": stored,
        "weights": weights,
        "activations": act_full,
        "stages": per_stage,
        "verify": max(full, chained + feeds + boundary),
        "run": max(full, pipeline),
    }


def check_estimate(est: dict, which: str, what: str, fix: str) -> None:
    """Refuse (one line, exit 2) when the ``which`` estimate exceeds the available memory."""
    held = weights_detail(est["weights_stored"], est["weights"])
    detail = f"estimated: {held}; activations {format_bytes(est['activations'])}"
    check_memory(est[which], what, detail, fix)


def export_plan(
    model_path: str | Path,
    g: Graph,
    assignment: np.ndarray,
    out_dir: str | Path,
    dims: dict[str, int] | None = None,
    stage: np.ndarray | None = None,
    verify: bool = False,
    tolerance: float | None = None,
    seed: int = 0,
    force: bool = False,
    inputs: list[str | Path] = (),
    verify_memory_ok: bool = False,
    before_write=None,
    placement: np.ndarray | None = None,
) -> dict:
    """Write the annotated model, the stage models and the sharding YAML; return a report.

    ``placement`` (the device of each block, :attr:`solver.pipeline.plan.Plan.placement`) makes a
    node of block b carry ``__ipu_number = placement[b]`` (``sharding.yaml`` too); its stage stays
    as it was. None: block b runs on device b.

    ``out_dir`` is checked first (:func:`solver.core.files.check_output_dir` with the model and
    ``inputs``): an existing non-empty folder is replaced only with ``force``. With ``verify``,
    the memory it needs is checked against the memory available before anything is written
    (skipped with ``verify_memory_ok``); ``before_write(estimate)`` may refuse too.
    ``tolerance`` None holds each output to the default of its type
    (:func:`solver.backends.verify.elem_tolerance`).
    """
    model_path, out_dir = Path(model_path), Path(out_dir)
    check_output_dir(out_dir, [model_path, *inputs], force=force, what="export")
    lay = _layout(model_path, g, assignment, dims, stage, placement)
    if verify and not verify_memory_ok:
        check_estimate(
            lay.estimate,
            "verify",
            "--verify (the full model, then the stages, in onnxruntime)",
            "pass --verify-memory-ok to run it anyway, or export without --verify",
        )
    if before_write is not None:
        before_write(lay.estimate)
    tmp = temp_dir_beside(out_dir)
    data = DataFiles(model_path.parent, tmp)
    try:
        report = _write_files(model_path, g, lay, tmp, data)
        if verify:
            report["verify"] = verify_stages(model_path, lay.model, tmp, report, tolerance, seed)
            report["verify"]["memory_estimate"] = lay.estimate["verify"]
        (tmp / "stages.json").write_text(json.dumps(report, indent=1))
        replace_dir(tmp, out_dir)
    except BaseException:
        data.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


@dataclass
class _Layout:
    """What an export writes, worked out before anything is written."""

    model: Any  # the loaded ModelProto, weights by reference (no bytes read)
    shapes: dict  # tensor name -> (shape, ONNX element type)
    blocks: np.ndarray  # block of every cost node
    stage: np.ndarray  # pipeline stage of every cost node
    place: np.ndarray  # device of every block
    devices: list[int]  # block of every ONNX node (:func:`onnx_placement`)
    stages: list[dict]  # :func:`stage_models`
    estimate: dict  # :func:`memory_estimate`

    @property
    def k(self) -> int:
        return int(self.blocks.max()) + 1


def _layout(model_path: Path, g: Graph, assignment, dims, stage, placement) -> _Layout:
    """Load the model (weights by reference), fix its dims and shapes, and cut it into stages."""
    import onnx  # heavy: onnx

    a = np.asarray(assignment, dtype=np.int64)
    stage = a if stage is None else np.asarray(stage)
    k = int(a.max()) + 1
    place = np.arange(k) if placement is None else np.asarray(placement, dtype=np.int64)
    if len(place) < k:
        raise MtppError(f"the placement lists {len(place)} devices but the plan has {k} blocks")
    model = onnx.load(str(model_path), load_external_data=False)
    check_external_paths(model, model_path.parent)
    fix_dims(model, dict(dims or {}))
    shapes = complete_shapes(model, model_path.parent)[0]
    dev, static = onnx_placement(model, g, a)
    stages = stage_models(model, dev, static, shapes, k)
    estimate = memory_estimate(model, g, a, stages, shapes)
    return _Layout(model, shapes, a, stage, place, dev, stages, estimate)


def _write_files(model_path: Path, g: Graph, lay: _Layout, tmp: Path, data: DataFiles) -> dict:
    """``stage{s}.onnx``, ``annotated.onnx`` (with their data files) and ``sharding.yaml``
    into ``tmp``; returns the report (``stages.json`` without the verify result)."""
    for st in lay.stages:
        if st["nodes"]:
            m = _build_stage(lay.model, st, lay.shapes)
            write_model(m, tmp / f"stage{st['stage']}.onnx", data, reuse=False)
    # the annotated model is the loaded one (no weight bytes in it), annotated in place
    _annotate(lay)
    write_model(lay.model, tmp / "annotated.onnx", data, reuse=True)
    data_files = sorted(data.dst)
    data.close()
    (tmp / "sharding.yaml").write_text(to_sharding_yaml(g, lay.place[lay.blocks], lay.stage))
    return {
        "model": str(model_path),
        "devices": lay.k,
        "placement": lay.place[: lay.k].tolist(),
        "stages": [
            {
                "stage": st["stage"],
                "file": f"stage{st['stage']}.onnx" if st["nodes"] else None,
                "onnx_nodes": len(st["nodes"]),
                "inputs": st["inputs"],
                "outputs": st["outputs"],
            }
            for st in lay.stages
        ],
        "graph_outputs": [o.name for o in lay.model.graph.output],
        "memory": lay.estimate,
        "data_files": data_files,
        "weight_bytes_copied": data.copied,
    }


def _annotate(lay: _Layout) -> None:
    """Give every node of the loaded model ``__ipu_number`` (its block's device) and
    ``__pipeline_stage`` (its block's stage), replacing any it had."""
    from onnx import helper  # heavy: onnx

    stage_of_block = {
        int(d): int(s) for d, s in zip(lay.blocks.tolist(), lay.stage.tolist(), strict=True)
    }
    for node, b in zip(lay.model.graph.node, lay.devices, strict=True):
        keep = [x for x in node.attribute if x.name not in ("__ipu_number", "__pipeline_stage")]
        del node.attribute[:]
        node.attribute.extend(keep)
        node.attribute.append(helper.make_attribute("__ipu_number", int(lay.place[b])))
        node.attribute.append(
            helper.make_attribute("__pipeline_stage", stage_of_block.get(int(b), int(b)))
        )
