"""Benchmark ONNX models built directly with onnx.helper: no download and no torch needed.

The builders behind ``generate:`` graphs in experiment configs and behind the command line
``python models/build.py KIND ...``. Every model has random (seeded) weights, runs in
onnxruntime, and reports its exact parameter count, which the tests compare with what the
importer finds. :func:`check_params` refuses unknown or absurd builder parameters before
anything is allocated.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from solver.errors import MtppError

OPSET = 17
F = TensorProto.FLOAT


@dataclass
class Builder:
    """Collects nodes and initializers with unique names and counts parameters."""

    seed: int = 0
    nodes: list = field(default_factory=list)
    inits: list = field(default_factory=list)
    params: int = 0
    buffers: int = 0  # stored float constants that are not trainable (counted as memory)
    _n: int = 0

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def name(self, base: str) -> str:
        self._n += 1
        return f"{base}_{self._n}"

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
        self.inits.append(numpy_helper.from_array(arr, name))
        if count:
            self.params += arr.size
        return name

    def const(self, base: str, values, dtype=np.int64) -> str:
        """A non-weight constant (shapes, axes): an initializer that is not a parameter."""
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs, base: str | None = None, n_out: int = 1, **attrs):
        base = base or op_type.lower()
        outs = [self.name(base) for _ in range(n_out)]
        self.nodes.append(
            helper.make_node(op_type, list(inputs), outs, name=self.name(op_type), **attrs)
        )
        return outs[0] if n_out == 1 else outs

    def model(self, name: str, inputs, outputs) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        m = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="mtpp-models"
        )
        m.ir_version = 8
        return onnx.shape_inference.infer_shapes(m)


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
) -> tuple[onnx.ModelProto, int]:
    """Pre-LN transformer encoder (``causal=False``) or decoder-only LM (``causal=True``) with
    token + position embeddings; the decoder ties its LM head to the token embedding."""
    ffn = ffn or 4 * hidden
    b = Builder(seed)
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
) -> tuple[onnx.ModelProto, int]:
    """ResNet-style: stem, ``stages`` stages of basic residual blocks (width doubles)."""
    b = Builder(seed)
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
) -> tuple[onnx.ModelProto, int]:
    """Inception-style: blocks of four parallel branches (1x1, 3x3, 5x5, pool) concatenated."""
    b = Builder(seed)
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
) -> tuple[onnx.ModelProto, int]:
    """U-Net: an encoder of conv pairs and max-pools, a decoder that upsamples and concatenates
    the encoder's feature map of the same size (long skip connections)."""
    b = Builder(seed)
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


BUILDERS = {
    "transformer": lambda **kw: transformer(causal=False, **kw),
    "decoder": lambda **kw: transformer(causal=True, **kw),
    "resnet": resnet,
    "inception": inception,
    "unet": unet,
}

# the checked-in small variants (models/small/*.onnx, each well under 5 MB)
SMALL = {
    "transformer": dict(layers=2, hidden=64, heads=4, seq=16, vocab=256),
    "decoder": dict(layers=2, hidden=64, heads=4, seq=16, vocab=256),
    "resnet": dict(stages=3, blocks=1, width=16, image=32, classes=10),
    "inception": dict(blocks=2, width=16, image=32, classes=10),
    "unet": dict(depth=2, width=8, image=32),
}


def save(model: onnx.ModelProto, path: Path) -> None:
    """Save (large models with external data beside them), checked."""
    path.parent.mkdir(parents=True, exist_ok=True)
    big = model.ByteSize() > 1_500_000_000
    onnx.save(model, str(path), save_as_external_data=big, location=path.name + ".data")
    onnx.checker.check_model(str(path))


# ---------------------------------------------------------------------- sizes, checked first
MAX_FLOATS = 2**29  # weights + one copy of every activation: 2 GiB of float32


def _defaults(kind: str, params: dict) -> dict:
    fn = transformer if kind in ("transformer", "decoder") else BUILDERS[kind]
    sig = inspect.signature(fn)
    kw = {k: p.default for k, p in sig.parameters.items() if k != "causal"}
    kw.update(params)
    return kw


def estimate_floats(kind: str, params: dict) -> int:
    """An upper estimate of the floats a model holds (weights + activations), from its
    parameters alone, so that absurd sizes are refused before anything is built."""
    p = _defaults(kind, params)
    bt = p["batch"]
    if kind in ("transformer", "decoder"):
        h, s = p["hidden"], p["seq"]
        ffn = p["ffn"] or 4 * h
        per_layer = 4 * h * h + 2 * h * ffn + 10 * h
        acts = bt * (p["heads"] * s * s * 3 + s * (ffn * 3 + h * 20))
        return 2 * (p["vocab"] * h + s * h + s * s + p["layers"] * (per_layer + acts) + h * h)
    im, w, bt = p["image"], p["width"], p["batch"]
    floats = bt * 3 * im * im + p["classes"] * w * 2**8
    if kind == "resnet":  # per block: two 3x3 convs (+ a 1x1), about 8 stored activations
        for s in range(p["stages"]):
            c, res = w * 2**s, max(1, im >> s)
            floats += p["blocks"] * (20 * c * c + 8 * bt * c * res * res)
    elif kind == "inception":  # per block: branches of 1x1, 3x3, 5x5 convs; 16 activations
        c, res = w, max(1, im // 2)
        for i in range(p["blocks"]):
            b = w * (i + 1) // 2 or 1
            floats += 4 * c * b + 35 * b * b + 16 * bt * (c + b) * res * res
            c, res = 4 * b, (max(1, res // 2) if i % 2 == 1 else res)
    else:  # unet: encoder and decoder levels of two 3x3 convs each, 10 activations a level
        for d in range(p["depth"] + 1):
            c, res = w * 2**d, max(1, im >> d)
            floats += 2 * (27 * c * c + 10 * bt * c * res * res)
    return 2 * floats


def check_params(kind: str, params: dict) -> None:
    """Refuse unknown, non-integer, non-positive or absurdly large builder parameters."""
    if kind not in BUILDERS:
        raise MtppError(f"unknown model {kind!r}; choose one of {', '.join(BUILDERS)}")
    valid = [k for k in _defaults(kind, {}) if k != "causal"]
    for key, value in params.items():
        if key not in valid:
            raise MtppError(f"{kind}: unknown parameter {key!r}; valid ones: {', '.join(valid)}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise MtppError(f"{kind}: parameter {key!r} must be a whole number, got {value!r}")
        if value < (0 if key in ("seed", "ffn") else 1):
            raise MtppError(f"{kind}: parameter {key!r} must be positive, got {value}")
    p = _defaults(kind, params)
    if kind in ("transformer", "decoder") and p["hidden"] % p["heads"]:
        raise MtppError(f"{kind}: hidden {p['hidden']} is not a multiple of heads {p['heads']}")
    n = estimate_floats(kind, params)
    if n > MAX_FLOATS:
        raise MtppError(
            f"{kind}: these parameters make a model of about {n:.3g} floats, more than the "
            f"{MAX_FLOATS:.3g} this builder allows; choose smaller sizes"
        )
