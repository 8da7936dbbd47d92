"""Benchmark ONNX models built directly with onnx.helper: no download and no torch needed.

The builders behind ``generate:`` graphs in experiment configs and behind the command line
``python models/build.py KIND ...``. Every model has random (seeded) weights, runs in
onnxruntime, and reports its exact parameter count, which the tests compare with what the
importer finds. :func:`check_params` refuses unknown builder parameters, and sizes whose
build would not fit in this machine's memory, before anything is allocated.

Weights go into the model's protobuf, or, with :class:`ExternalWeights`, are streamed into one
external-data file as they are made: only one tensor is in memory at a time, so a model far
larger than memory builds (a BERT-large in about a hundred MB of RSS).
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from solver.core.errors import MtppError
from solver.core.units import format_bytes
from solver.frontends.onnx.ort import available_memory

OPSET = 17
F = TensorProto.FLOAT


INLINE_BYTES = 1024  # smaller tensors (shapes, axes, scalars) stay in the protobuf


@dataclass
class ExternalWeights:
    """One external-data file that weights are streamed into as they are made: each tensor's
    bytes are appended and only its location, offset and length stay in the model. The file is
    written under a temporary name beside ``path`` and takes its name in :meth:`commit`."""

    path: Path
    offset: int = 0
    _file: BinaryIO | None = None

    @property
    def partial(self) -> Path:
        return self.path.with_name(f".{self.path.name}.partial")

    def store(self, tensor: TensorProto, arr: np.ndarray) -> None:
        """Append ``arr`` (little-endian) and point ``tensor`` at it."""
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.partial, "wb")  # noqa: SIM115 (closed by commit/discard)
        data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        self._file.write(data.data)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", self.offset),
                           ("length", data.nbytes)):  # fmt: skip
            tensor.external_data.add(key=key, value=str(value))
        self.offset += data.nbytes

    def commit(self) -> None:
        """Close the file and give it its final name."""
        if self._file is not None:
            self._file.close()
            os.replace(self.partial, self.path)
            self._file = None

    def discard(self) -> None:
        """Close and remove an unfinished file (a build that failed)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self.partial.unlink(missing_ok=True)


@dataclass
class Builder:
    """Collects nodes and initializers with unique names and counts parameters. Initializers
    go straight into the model being built (or, with ``external``, into its data file)."""

    seed: int = 0
    external: ExternalWeights | None = None
    nodes: list = field(default_factory=list)
    params: int = 0
    buffers: int = 0  # stored float constants that are not trainable (counted as memory)
    _n: int = 0

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.proto = onnx.ModelProto()

    def name(self, base: str) -> str:
        self._n += 1
        return f"{base}_{self._n}"

    def store(self, name: str, arr: np.ndarray) -> None:
        """One initializer: inline, or streamed to the external file when it is not tiny."""
        tensor = self.proto.graph.initializer.add()
        if self.external is None or arr.nbytes < INLINE_BYTES:
            tensor.CopyFrom(numpy_helper.from_array(arr, name))
            return
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
        tensor.dims.extend(arr.shape)
        self.external.store(tensor, arr)

    def weight(
        self,
        base: str,
        shape,
        scale: float | None = None,
        value: float | None = None,
        count: bool = True,
    ) -> str:
        name = self.name(base)
        if value is not None:
            arr = np.full(shape, value, np.float32)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else int(shape[0])
            s = scale if scale is not None else 1.0 / math.sqrt(max(1, fan_in))
            arr = (self.rng.standard_normal(shape) * s).astype(np.float32)
        self.store(name, arr)
        if count:
            self.params += arr.size
        return name

    def const(self, base: str, values, dtype=np.int64) -> str:
        """A non-weight constant (shapes, axes): an initializer that is not a parameter."""
        name = self.name(base)
        self.store(name, np.asarray(values, dtype=dtype))
        return name

    def op(self, op_type: str, inputs, base: str | None = None, n_out: int = 1, **attrs):
        base = base or op_type.lower()
        outs = [self.name(base) for _ in range(n_out)]
        self.nodes.append(
            helper.make_node(op_type, list(inputs), outs, name=self.name(op_type), **attrs)
        )
        return outs[0] if n_out == 1 else outs

    def model(self, name: str, inputs, outputs) -> onnx.ModelProto:
        """The finished model, with inferred shapes (the weights are not copied)."""
        m = self.proto
        m.ir_version = 8
        m.producer_name = "mtpp-models"
        m.opset_import.add(domain="", version=OPSET)
        m.graph.name = name
        m.graph.node.extend(self.nodes)
        m.graph.input.extend(inputs)
        m.graph.output.extend(outputs)
        inferred = onnx.shape_inference.infer_shapes(_without_weight_bytes(m)).graph
        m.graph.value_info.extend(inferred.value_info)
        del m.graph.output[:]
        m.graph.output.extend(inferred.output)
        return m


def _without_weight_bytes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose large initializers keep their name, type and dims but no bytes
    (shape inference needs nothing more, and never a second copy of the weights)."""
    light = onnx.ModelProto(ir_version=model.ir_version, producer_name=model.producer_name)
    light.opset_import.extend(model.opset_import)
    g = model.graph
    light.graph.name = g.name
    light.graph.node.extend(g.node)
    light.graph.input.extend(g.input)
    light.graph.output.extend(g.output)
    for t in g.initializer:
        if t.data_location == TensorProto.EXTERNAL or len(t.raw_data) >= INLINE_BYTES:
            light.graph.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims)
        else:
            light.graph.initializer.add().CopyFrom(t)
    return light


# ---------------------------------------------------------------------- transformer
def _linear(b: Builder, x: str, d_in: int, d_out: int, base: str) -> str:
    w = b.weight(f"{base}.w", [d_in, d_out])
    bias = b.weight(f"{base}.b", [d_out], value=0.0)
    return b.op("Add", [b.op("MatMul", [x, w]), bias])


def _layernorm(b: Builder, x: str, d: int, base: str) -> str:
    s = b.weight(f"{base}.scale", [d], value=1.0)
    t = b.weight(f"{base}.bias", [d], value=0.0)
    return b.op("LayerNormalization", [x, s, t], axis=-1, epsilon=1e-5)


def _gelu(b: Builder, x: str) -> str:
    inv_sqrt2 = b.const("inv_sqrt2", 1 / math.sqrt(2), np.float32)
    half = b.const("half", 0.5, np.float32)
    one = b.const("one", 1.0, np.float32)
    erf = b.op("Erf", [b.op("Mul", [x, inv_sqrt2])])
    return b.op("Mul", [b.op("Mul", [x, half]), b.op("Add", [erf, one])])


def _attention(
    b: Builder, x: str, batch: int, seq: int, d: int, heads: int, causal: str | None, base: str
) -> str:
    hd = d // heads
    qkv = _linear(b, x, d, 3 * d, f"{base}.qkv")
    q, k, v = b.op("Split", [qkv, b.const("split", [d, d, d])], n_out=3, axis=-1)
    to_heads = b.const("heads_shape", [batch, seq, heads, hd])

    def split_heads(t: str, perm) -> str:
        return b.op("Transpose", [b.op("Reshape", [t, to_heads])], perm=perm)

    qh = split_heads(q, [0, 2, 1, 3])  # [B, H, S, hd]
    kh = split_heads(k, [0, 2, 3, 1])  # [B, H, hd, S]
    vh = split_heads(v, [0, 2, 1, 3])
    scores = b.op(
        "Mul", [b.op("MatMul", [qh, kh]), b.const("scale", 1 / math.sqrt(hd), np.float32)]
    )
    if causal is not None:
        scores = b.op("Add", [scores, causal])
    probs = b.op("Softmax", [scores], axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [probs, vh])], perm=[0, 2, 1, 3])
    ctx = b.op("Reshape", [ctx, b.const("merge_shape", [batch, seq, d])])
    return _linear(b, ctx, d, d, f"{base}.proj")


def transformer(
    layers: int = 4,
    hidden: int = 256,
    heads: int = 4,
    ffn: int | None = None,
    seq: int = 64,
    vocab: int = 1000,
    batch: int = 1,
    causal: bool = False,
    seed: int = 0,
    external: ExternalWeights | None = None,
) -> tuple[onnx.ModelProto, int]:
    """Pre-LN transformer encoder (``causal=False``) or decoder-only LM (``causal=True``) with
    token + position embeddings; the decoder ties its LM head to the token embedding."""
    ffn = ffn or 4 * hidden
    b = Builder(seed, external)
    tok = b.weight("tok_emb", [vocab, hidden], scale=0.02)
    pos = b.weight("pos_emb", [seq, hidden], scale=0.02)
    ids = "input_ids"
    x = b.op("Add", [b.op("Gather", [tok, ids], axis=0), pos])
    mask = None
    if causal:
        m = np.triu(np.full((seq, seq), -1e4, np.float32), 1)
        mask = b.const("causal_mask", m, np.float32)
        b.buffers += m.size  # a stored float constant: the importer counts it as memory
    for i in range(layers):
        h = _attention(
            b, _layernorm(b, x, hidden, f"l{i}.ln1"), batch, seq, hidden, heads, mask, f"l{i}.attn"
        )
        x = b.op("Add", [x, h])
        h = _linear(b, _layernorm(b, x, hidden, f"l{i}.ln2"), hidden, ffn, f"l{i}.fc1")
        h = _linear(b, _gelu(b, h), ffn, hidden, f"l{i}.fc2")
        x = b.op("Add", [x, h])
    x = _layernorm(b, x, hidden, "ln_f")
    if causal:  # tied LM head: the same tensor as the token embedding, counted once
        out = b.op("MatMul", [x, b.op("Transpose", [tok], perm=[1, 0])], base="logits")
    else:
        out = b.op("Tanh", [_linear(b, x, hidden, hidden, "pooler")], base="hidden")
    kind = "decoder" if causal else "encoder"
    model = b.model(
        f"transformer-{kind}",
        [helper.make_tensor_value_info(ids, TensorProto.INT64, [batch, seq])],
        [helper.make_tensor_value_info(out, F, None)],
    )
    return model, b.params


# ---------------------------------------------------------------------- CNNs
def _conv_bn_relu(
    b: Builder, x: str, c_in: int, c_out: int, k: int, stride: int = 1, relu: bool = True
) -> str:
    w = b.weight("conv.w", [c_out, c_in, k, k])
    y = b.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
    scale = b.weight("bn.scale", [c_out], value=1.0)
    bias = b.weight("bn.bias", [c_out], value=0.0)
    mean = b.weight("bn.mean", [c_out], value=0.0)
    var = b.weight("bn.var", [c_out], value=1.0)
    y = b.op("BatchNormalization", [y, scale, bias, mean, var], epsilon=1e-5)
    return b.op("Relu", [y]) if relu else y


def _image_model(b: Builder, name: str, out: str, batch: int, image: int):
    """The finished model of a CNN reading ``image`` [batch, 3, image, image], and its params."""
    inputs = [helper.make_tensor_value_info("image", F, [batch, 3, image, image])]
    model = b.model(name, inputs, [helper.make_tensor_value_info(out, F, None)])
    return model, b.params


def _head(b: Builder, x: str, c: int, classes: int) -> str:
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    w = b.weight("fc.w", [classes, c])
    bias = b.weight("fc.b", [classes], value=0.0)
    return b.op("Gemm", [x, w, bias], base="logits", transB=1)


def resnet(
    stages: int = 4,
    blocks: int = 2,
    width: int = 32,
    image: int = 64,
    classes: int = 100,
    batch: int = 1,
    seed: int = 0,
    external: ExternalWeights | None = None,
) -> tuple[onnx.ModelProto, int]:
    """ResNet-style: stem, ``stages`` stages of basic residual blocks (width doubles)."""
    b = Builder(seed, external)
    x = _conv_bn_relu(b, "image", 3, width, 3)
    c = width
    for s in range(stages):
        c_out = width * 2**s
        for j in range(blocks):
            stride = 2 if (j == 0 and s > 0) else 1
            h = _conv_bn_relu(b, x, c, c_out, 3, stride)
            h = _conv_bn_relu(b, h, c_out, c_out, 3, relu=False)
            skip = (
                x
                if (stride == 1 and c == c_out)
                else _conv_bn_relu(b, x, c, c_out, 1, stride, relu=False)
            )
            x = b.op("Relu", [b.op("Add", [h, skip])])
            c = c_out
    out = _head(b, x, c, classes)
    return _image_model(b, "resnet", out, batch, image)


def inception(
    blocks: int = 3,
    width: int = 32,
    image: int = 64,
    classes: int = 100,
    batch: int = 1,
    seed: int = 0,
    external: ExternalWeights | None = None,
) -> tuple[onnx.ModelProto, int]:
    """Inception-style: blocks of four parallel branches (1x1, 3x3, 5x5, pool) concatenated."""
    b = Builder(seed, external)
    x = _conv_bn_relu(b, "image", 3, width, 3, stride=2)
    c = width
    for i in range(blocks):
        w = width * (i + 1) // 2 or 1
        b1 = _conv_bn_relu(b, x, c, w, 1)
        b3 = _conv_bn_relu(b, _conv_bn_relu(b, x, c, w, 1), w, w, 3)
        b5 = _conv_bn_relu(b, _conv_bn_relu(b, x, c, w // 2 or 1, 1), w // 2 or 1, w, 5)
        bp = _conv_bn_relu(
            b, b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]), c, w, 1
        )
        x = b.op("Concat", [b1, b3, b5, bp], axis=1)
        c = 4 * w
        if i % 2 == 1:
            x = b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    out = _head(b, x, c, classes)
    return _image_model(b, "inception", out, batch, image)


def unet(
    depth: int = 3,
    width: int = 16,
    image: int = 64,
    classes: int = 2,
    batch: int = 1,
    seed: int = 0,
    external: ExternalWeights | None = None,
) -> tuple[onnx.ModelProto, int]:
    """U-Net: an encoder of conv pairs and max-pools, a decoder that upsamples and concatenates
    the encoder's feature map of the same size (long skip connections)."""
    b = Builder(seed, external)
    x, c, skips = "image", 3, []
    for d in range(depth):
        c_out = width * 2**d
        x = _conv_bn_relu(b, _conv_bn_relu(b, x, c, c_out, 3), c_out, c_out, 3)
        skips.append((x, c_out))
        x = b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
        c = c_out
    c_mid = width * 2**depth
    x = _conv_bn_relu(b, _conv_bn_relu(b, x, c, c_mid, 3), c_mid, c_mid, 3)
    c = c_mid
    for skip, c_skip in reversed(skips):
        up_w = b.weight("up.w", [c, c_skip, 2, 2])
        x = b.op("ConvTranspose", [x, up_w], kernel_shape=[2, 2], strides=[2, 2])
        x = b.op("Concat", [x, skip], axis=1)
        x = _conv_bn_relu(b, _conv_bn_relu(b, x, 2 * c_skip, c_skip, 3), c_skip, c_skip, 3)
        c = c_skip
    w = b.weight("out.w", [classes, c, 1, 1])
    out = b.op("Conv", [x, w], base="mask", kernel_shape=[1, 1])
    return _image_model(b, "unet", out, batch, image)


# ---------------------------------------------------------------------- vision transformer
def vit(
    image: int = 224,
    patch: int = 16,
    layers: int = 12,
    hidden: int = 192,
    heads: int = 3,
    ffn: int | None = None,
    classes: int = 1000,
    batch: int = 1,
    seed: int = 0,
    external: ExternalWeights | None = None,
) -> tuple[onnx.ModelProto, int]:
    """Vision transformer (ViT-Ti by default): a patch-embedding Conv, a class token and
    position embeddings, pre-LN encoder layers, a linear head on the class token."""
    ffn = ffn or 4 * hidden
    grid = image // patch
    seq = grid * grid + 1
    b = Builder(seed, external)
    w = b.weight("patch.w", [hidden, 3, patch, patch])
    bias = b.weight("patch.b", [hidden], value=0.0)
    x = b.op("Conv", ["image", w, bias], kernel_shape=[patch, patch], strides=[patch, patch])
    x = b.op("Reshape", [x, b.const("tokens_shape", [batch, hidden, seq - 1])])
    x = b.op("Transpose", [x], perm=[0, 2, 1])
    cls = b.weight("cls", [1, 1, hidden], scale=0.02)
    cls = b.op("Expand", [cls, b.const("cls_shape", [batch, 1, hidden])])
    pos = b.weight("pos", [1, seq, hidden], scale=0.02)
    x = b.op("Add", [b.op("Concat", [cls, x], axis=1), pos])
    for i in range(layers):
        h = _attention(
            b, _layernorm(b, x, hidden, f"l{i}.ln1"), batch, seq, hidden, heads, None, f"l{i}.attn"
        )
        x = b.op("Add", [x, h])
        h = _linear(b, _layernorm(b, x, hidden, f"l{i}.ln2"), hidden, ffn, f"l{i}.fc1")
        x = b.op("Add", [x, _linear(b, _gelu(b, h), ffn, hidden, f"l{i}.fc2")])
    x = b.op("Gather", [_layernorm(b, x, hidden, "ln_f"), b.const("cls_index", 0)], axis=1)
    out = _linear(b, x, hidden, classes, "head")
    return _image_model(b, "vit", out, batch, image)


BUILDERS = {
    "transformer": lambda **kw: transformer(causal=False, **kw),
    "decoder": lambda **kw: transformer(causal=True, **kw),
    "resnet": resnet,
    "inception": inception,
    "unet": unet,
    "vit": vit,
}

# the checked-in small variants (models/small/*.onnx, each well under 5 MB)
SMALL = {
    "transformer": dict(layers=2, hidden=64, heads=4, seq=16, vocab=256),
    "decoder": dict(layers=2, hidden=64, heads=4, seq=16, vocab=256),
    "resnet": dict(stages=3, blocks=1, width=16, image=32, classes=10),
    "inception": dict(blocks=2, width=16, image=32, classes=10),
    "unet": dict(depth=2, width=8, image=32),
}


def save(model: onnx.ModelProto, path: Path, external: ExternalWeights | None = None) -> None:
    """Save, checked. Weights already streamed to ``external`` (a file in the same folder) are
    committed beside the model; otherwise a model over 1.5 GB gets its weights written to
    ``PATH.data`` (one protobuf holds at most 2 GB)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if external is not None:
        if external.path.parent.resolve() != path.parent.resolve():
            raise ValueError(f"external weights {external.path} are not beside {path}")
        external.commit()
        onnx.save(model, str(path))
    else:
        big = model.ByteSize() > 1_500_000_000
        onnx.save(model, str(path), save_as_external_data=big, location=path.name + ".data")
    onnx.checker.check_model(str(path))


# ---------------------------------------------------------------------- sizes, checked first
# What a build holds, as measured with /usr/bin/time -v (docs: models/build.py --help):
BASE_BYTES = 256 * 2**20  # the interpreter with numpy, onnx and the builder loaded
NODE_BYTES = 4096  # one node: its proto, its value_info, the copies shape inference makes
PROTO_COPIES = 6  # the model, then onnx.save serializing it (protobuf grows its buffer)
DRAW_BYTES = 12  # per float of the tensor being drawn: float64 samples, then float32
MAX_LISTED = 64  # conv layers (stages, levels) summed one by one in an estimate


@dataclass(frozen=True)
class BuildSize:
    """What building a model allocates, estimated from its parameters alone."""

    weight_floats: int  # every stored float: parameters and buffers such as a causal mask
    largest_floats: int  # the largest single tensor (what streaming holds at once)
    nodes: int

    def memory(self, external: bool) -> int:
        """Peak bytes of the build: every weight held PROTO_COPIES times, or (``external``)
        one tensor at a time."""
        held = 0 if external else PROTO_COPIES * 4 * self.weight_floats
        return BASE_BYTES + NODE_BYTES * self.nodes + DRAW_BYTES * self.largest_floats + held


def _defaults(kind: str, params: dict) -> dict:
    fn = transformer if kind in ("transformer", "decoder") else BUILDERS[kind]
    sig = inspect.signature(fn)
    kw = {k: p.default for k, p in sig.parameters.items() if k not in ("causal", "external")}
    kw.update(params)
    return kw


def _encoder_size(p: dict, ends: int, end_largest: int) -> BuildSize:
    """``p['layers']`` pre-LN encoder layers, plus ``ends`` floats of embeddings and heads."""
    h, ffn = p["hidden"], p["ffn"] or 4 * p["hidden"]
    per_layer = 4 * h * h + 2 * h * ffn + 9 * h + ffn
    largest = max(3 * h * h + 3 * h, h * ffn, end_largest)
    return BuildSize(p["layers"] * per_layer + ends, largest, 32 * p["layers"] + 16)


def estimate_size(kind: str, params: dict) -> BuildSize:
    """What building ``kind`` with ``params`` allocates, from the parameters alone (the
    transformers' weights exactly, the CNNs' from above), so that sizes that cannot be built
    are refused before anything is."""
    p = _defaults(kind, params)
    h = p.get("hidden", 0)
    if kind in ("transformer", "decoder"):
        s, table = p["seq"], p["vocab"] * h
        # embeddings, final norm, and a causal mask (decoder) or a pooler (encoder)
        tail = s * s if kind == "decoder" else h * h + h
        return _encoder_size(p, table + s * h + 2 * h + tail, max(table, s * h, tail))
    if kind == "vit":
        seq = (p["image"] // p["patch"]) ** 2 + 1
        patches = 3 * p["patch"] ** 2 * h + h
        head = p["classes"] * h + p["classes"]
        ends = patches + h + seq * h + 2 * h + head  # patches, class token, positions, norm
        return _encoder_size(p, ends, max(patches, seq * h, head))
    w = p["width"]
    head = p["classes"] * w * 2**8
    # the weights of each conv layer (upper estimates); past MAX_LISTED layers the nodes alone
    # are more than any memory, so the list stops there (and stays cheap for absurd counts)
    if kind == "resnet":  # per block: two 3x3 convs and a 1x1 skip, with batch norms
        count = p["stages"] * p["blocks"]
        stages = range(min(p["stages"], MAX_LISTED))
        convs = [20 * (w * 2**s) ** 2 for s in stages for _ in range(min(p["blocks"], MAX_LISTED))]
    elif kind == "inception":  # per block: branches of 1x1, 3x3 and 5x5 convs
        count, c, convs = p["blocks"], w, []
        for i in range(min(count, MAX_LISTED)):
            b = w * (i + 1) // 2 or 1
            convs.append(4 * c * b + 35 * b * b)
            c = 4 * b
    else:  # unet: encoder and decoder levels of two 3x3 convs each
        count = p["depth"] + 1
        convs = [2 * 27 * (w * 2**d) ** 2 for d in range(min(count, MAX_LISTED))]
    return BuildSize(sum(convs) + head, max([head, *convs]), 24 * count + 16)


def check_params(kind: str, params: dict, external: bool = False) -> None:
    """Refuse unknown, non-integer or non-positive builder parameters, and sizes whose build
    (in memory, or streaming the weights when ``external``) would not fit in the memory
    available now."""
    if kind not in BUILDERS:
        raise MtppError(f"unknown model {kind!r}; choose one of {', '.join(BUILDERS)}")
    valid = list(_defaults(kind, {}))
    for key, value in params.items():
        if key not in valid:
            raise MtppError(f"{kind}: unknown parameter {key!r}; valid ones: {', '.join(valid)}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise MtppError(f"{kind}: parameter {key!r} must be a whole number, got {value!r}")
        if value < (0 if key in ("seed", "ffn") else 1):
            raise MtppError(f"{kind}: parameter {key!r} must be positive, got {value}")
    p = _defaults(kind, params)
    if kind in ("transformer", "decoder", "vit") and p["hidden"] % p["heads"]:
        raise MtppError(f"{kind}: hidden {p['hidden']} is not a multiple of heads {p['heads']}")
    if kind == "vit" and not p["patch"] <= p["image"]:
        raise MtppError(f"vit: patch {p['patch']} is larger than the image {p['image']}")
    size = estimate_size(kind, params)
    need, free = size.memory(external), available_memory()
    if need > free:
        hint = ""
        if not external and size.memory(True) <= free:
            hint = ", or stream the weights to a file (models/build.py --external-weights)"
        raise MtppError(
            f"{kind}: building these parameters needs about {format_bytes(need)} of memory "
            f"({size.weight_floats:.3g} floats of weights), more than the {format_bytes(free)} "
            f"available; choose smaller sizes{hint}"
        )
