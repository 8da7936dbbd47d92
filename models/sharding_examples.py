"""Small ONNX models for operator-level sharding, with random weights (seeded).

- ``ffn``: the seed's FeedForward network: MatMul + Add, ReLU, MatMul + Add on [64, 64];
- ``transformer``: encoder layers (LayerNorm, multi-head attention with Reshape/Transpose,
  Softmax, a GELU feed-forward) over an embedding Gather, batch x seq x hidden; ``--decoder``
  makes it GPT-shaped (causal mask, final LayerNorm, language-model head);
- ``mlp``: Gemm layers with ReLU between them;
- ``convnet``: two Conv layers with pooling, Flatten and a Gemm classifier.

``python models/sharding_examples.py transformer --layers 4 --out t.onnx``; ``--no-weights``
stores the weights in ``<out>.data``, a sparse file of the full size whose blocks are never
written (they read as zeros: shapes only, enough for planning a BERT-large-sized model without
gigabytes of random numbers; ``--verify`` of such a model compares zeros).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class _Builder:
    def __init__(self, seed: int, weights: bool) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.weights = weights
        self.count = 0

    def weight(self, name: str, shape: tuple[int, ...], scale: float | None = None):
        if not self.weights and len(shape) >= 1 and int(np.prod(shape)) > 16:
            t = TensorProto()
            t.name, t.data_type = name, TensorProto.FLOAT
            t.dims.extend(shape)
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", "absent.bin"), ("offset", "0"), ("length", "0")):
                e = t.external_data.add()
                e.key, e.value = k, v
            self.inits.append(t)
            return name
        scale = scale if scale is not None else 1.0 / np.sqrt(shape[0] if shape else 1)
        arr = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def const(self, name: str, value, dtype=np.float32):
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(self, op: str, inputs: list[str], name: str, n_out: int = 1, **attrs) -> str:
        outs = [f"{name}_out{i}" if i else f"{name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs[0]

    def model(self, inputs, outputs, name: str):
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        m.ir_version = 8
        return m


def ffn(seed: int = 0, size: int = 64, weights: bool = True):
    """The seed's FFN: dense1 (MatMul + Add), ReLU, dense2 (MatMul + Add)."""
    b = _Builder(seed, weights)
    x = "x"
    h = b.node("MatMul", [x, b.weight("dense1.weight", (size, size))], "dense1.matmul")
    h = b.node("Add", [h, b.weight("dense1.bias", (size,), 0.1)], "dense1.add")
    h = b.node("Relu", [h], "relu")
    h = b.node("MatMul", [h, b.weight("dense2.weight", (size, size))], "dense2.matmul")
    b.node("Add", [h, b.weight("dense2.bias", (size,), 0.1)], "dense2.add")
    b.nodes[-1].output[0] = "y"
    return b.model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])],
        "ffn",
    )


def mlp(seed: int = 0, batch: int = 16, sizes=(32, 64, 64, 16), weights: bool = True):
    """Gemm (transB=1, with bias) layers and ReLU between them."""
    b = _Builder(seed, weights)
    h = "x"
    for i, (m, n) in enumerate(zip(sizes, sizes[1:], strict=False)):
        w = b.weight(f"fc{i}.weight", (n, m), 1.0 / np.sqrt(m))
        h = b.node("Gemm", [h, w, b.weight(f"fc{i}.bias", (n,), 0.1)], f"fc{i}", transB=1)
        if i < len(sizes) - 2:
            h = b.node("Relu", [h], f"relu{i}")
    b.nodes[-1].output[0] = "y"
    return b.model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, sizes[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, sizes[-1]])],
        "mlp",
    )


def transformer(
    seed: int = 0,
    layers: int = 2,
    batch: int = 2,
    seq: int = 16,
    hidden: int = 32,
    heads: int = 4,
    ffn_size: int | None = None,
    vocab: int = 64,
    weights: bool = True,
    decoder: bool = False,
):
    """Embedding Gather, then ``layers`` pre-LN encoder layers; output [batch, seq, hidden].

    ``decoder``: GPT-style instead: a causal mask added to the attention scores, and a final
    LayerNorm plus a language-model head (a MatMul to the vocabulary); output the logits."""
    b = _Builder(seed, weights)
    ffn_size = ffn_size or 4 * hidden
    dh = hidden // heads
    h = b.node("Gather", [b.weight("embed", (vocab, hidden), 1.0), "ids"], "embed")
    shape4 = b.const("shape_bshd", [batch, seq, heads, dh], np.int64)
    shape3 = b.const("shape_bsh", [batch, seq, hidden], np.int64)
    scale = b.const("scale", 1.0 / np.sqrt(dh))
    half, one, rt2 = b.const("half", 0.5), b.const("one", 1.0), b.const("sqrt2", np.sqrt(2.0))
    if decoder:
        causal = np.triu(np.full((seq, seq), -1e4, dtype=np.float32), k=1)[None, None]
        mask = b.const("causal_mask", causal)
    for i in range(layers):
        p = f"l{i}."

        def ln(x, tag, p=p):
            return b.node(
                "LayerNormalization",
                [
                    x,
                    b.weight(p + tag + ".g", (hidden,), 0.1),
                    b.weight(p + tag + ".b", (hidden,), 0.1),
                ],
                p + tag,
                axis=-1,
            )

        def dense(x, tag, n_in, n_out, p=p):
            y = b.node("MatMul", [x, b.weight(p + tag + ".w", (n_in, n_out))], p + tag + ".matmul")
            return b.node("Add", [y, b.weight(p + tag + ".b", (n_out,), 0.1)], p + tag + ".add")

        x = ln(h, "ln1")
        qkv = []
        for t in "qkv":
            y = dense(x, t, hidden, hidden)
            y = b.node("Reshape", [y, shape4], p + t + ".reshape")
            perm = [0, 2, 3, 1] if t == "k" else [0, 2, 1, 3]
            qkv.append(b.node("Transpose", [y], p + t + ".transpose", perm=perm))
        s = b.node("MatMul", qkv[:2], p + "scores")
        s = b.node("Mul", [s, scale], p + "scale")
        if decoder:
            s = b.node("Add", [s, mask], p + "mask")
        s = b.node("Softmax", [s], p + "softmax", axis=-1)
        c = b.node("MatMul", [s, qkv[2]], p + "context")
        c = b.node("Transpose", [c], p + "context.transpose", perm=[0, 2, 1, 3])
        c = b.node("Reshape", [c, shape3], p + "context.reshape")
        h = b.node("Add", [h, dense(c, "o", hidden, hidden)], p + "residual1")
        x = ln(h, "ln2")
        y = dense(x, "ffn1", hidden, ffn_size)
        g = b.node("Div", [y, rt2], p + "gelu.div")
        g = b.node("Erf", [g], p + "gelu.erf")
        g = b.node("Add", [g, one], p + "gelu.add")
        g = b.node("Mul", [y, g], p + "gelu.mul")
        g = b.node("Mul", [g, half], p + "gelu.half")
        h = b.node("Add", [h, dense(g, "ffn2", ffn_size, hidden)], p + "residual2")
    out = [batch, seq, hidden]
    if decoder:
        h = b.node(
            "LayerNormalization",
            [h, b.weight("lnf.g", (hidden,), 0.1), b.weight("lnf.b", (hidden,), 0.1)],
            "lnf",
            axis=-1,
        )
        b.node("MatMul", [h, b.weight("lm_head.w", (hidden, vocab))], "lm_head")
        out = [batch, seq, vocab]
    b.nodes[-1].output[0] = "y"
    return b.model(
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [batch, seq])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
        "decoder" if decoder else "transformer",
    )


def convnet(seed: int = 0, batch: int = 4, channels: int = 8, size: int = 8, weights: bool = True):
    """Conv (bias) + ReLU + MaxPool, Conv + GlobalAveragePool, Flatten, Gemm: 10 classes."""
    b = _Builder(seed, weights)
    c2 = 2 * channels
    h = b.node(
        "Conv",
        ["x", b.weight("conv1.w", (c2, channels, 3, 3), 0.2), b.weight("conv1.b", (c2,), 0.1)],
        "conv1",
        pads=[1, 1, 1, 1],
    )
    h = b.node("Relu", [h], "relu1")
    h = b.node("MaxPool", [h], "pool1", kernel_shape=[2, 2], strides=[2, 2])
    h = b.node("Conv", [h, b.weight("conv2.w", (c2, c2, 3, 3), 0.2)], "conv2", pads=[1, 1, 1, 1])
    h = b.node("GlobalAveragePool", [h], "gap")
    h = b.node("Flatten", [h], "flatten", axis=1)
    w = b.weight("fc.w", (10, c2), 0.3)
    b.node("Gemm", [h, w, b.weight("fc.b", (10,), 0.1)], "fc", transB=1)
    b.nodes[-1].output[0] = "y"
    return b.model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        "convnet",
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("model", choices=["ffn", "mlp", "transformer", "convnet"])
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--decoder", action="store_true", help="causal mask, final LN, LM head")
    p.add_argument("--no-weights", action="store_true")
    a = p.parse_args()
    w = not a.no_weights
    if a.model == "ffn":
        m = ffn(a.seed, weights=w)
    elif a.model == "convnet":
        m = convnet(a.seed, batch=a.batch, weights=w)
    elif a.model == "mlp":
        m = mlp(a.seed, batch=a.batch, weights=w)
    else:
        m = transformer(
            a.seed, a.layers, a.batch, a.seq, a.hidden, a.heads, vocab=a.vocab, weights=w,
            decoder=a.decoder,
        )  # fmt: skip
    if not w:
        _point_at_sparse_file(m, Path(a.out))
    onnx.save(m, a.out)


def _point_at_sparse_file(m, out: Path, align: int = 4096) -> None:
    """Give every external weight its own aligned range of ``<out>.data`` and create that file
    with ``truncate``: its full size, no block written (as models/llama.py does)."""
    data = out.with_name(out.name + ".data")
    offset = 0
    for t in m.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL:
            continue
        length = int(np.prod(t.dims)) * 4  # float32
        del t.external_data[:]
        for k, v in (("location", data.name), ("offset", str(offset)), ("length", str(length))):
            e = t.external_data.add()
            e.key, e.value = k, v
        offset += -(-length // align) * align
    with open(data, "wb") as fh:
        fh.truncate(offset)


if __name__ == "__main__":
    main()
