"""Llama-shaped decoder ONNX models whose fp16 weights live in a sparse external data file.

    python models/llama.py --preset 7b  --out models/generated/llama7b.onnx
    python models/llama.py --preset 70b --out models/generated/llama70b.onnx
    python models/llama.py --layers 2 --hidden 64 --mlp 160 --heads 4 --kv-heads 2 --vocab 128 \\
        --random-weights --out models/generated/llama-tiny.onnx

The graph is the Llama-2 decoder (token embedding, per layer: RMSNorm, q/k/v projections,
rotary embedding, grouped-query attention with a causal mask, output projection, residual,
RMSNorm, SwiGLU MLP, residual; final RMSNorm and an untied LM head). Every weight is an
initializer with ``data_location = EXTERNAL`` pointing at an offset in ``<out>.data``. That file
is created with ``truncate``: it has the full size (13.5 GB for the 7B) but no block is ever
written, so it takes no disk space and building takes well under a second. Such weights read
as zeros: the model has the exact shape, sizes and FLOPs of the real one, for planning, not
for numerics. ``--random-weights`` writes seeded random values instead (small models only).
Nodes are named by their module as torch's exporter names them (``/model/layers.3/MatMul_30``,
``/model/embed_tokens/...``, ``/model/norm/...``, ``/lm_head/...``), so the planners read the
layers (practitioners' splits, layer-granular plans, framework exports).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 17
H = TensorProto.FLOAT16
ALIGN = 4096  # offsets of external tensors, so that loaders may map them page by page

PRESETS = {
    # Llama-2-7B: 32 layers, hidden 4096, MLP 11008, 32 heads (no grouped-query attention)
    "7b": dict(layers=32, hidden=4096, mlp=11008, heads=32, kv_heads=32, vocab=32000),
    # Llama-2-70B: 80 layers, hidden 8192, MLP 28672, 64 heads, 8 KV heads
    "70b": dict(layers=80, hidden=8192, mlp=28672, heads=64, kv_heads=8, vocab=32000),
}


@dataclass(frozen=True)
class LlamaShape:
    """The sizes that define a Llama decoder; ``seq`` and ``batch`` fix the input shape."""

    layers: int = 2
    hidden: int = 64
    mlp: int = 172
    heads: int = 4
    kv_heads: int = 4
    vocab: int = 256
    seq: int = 128
    batch: int = 1

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "mlp", "heads", "kv_heads", "vocab", "seq", "batch"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv-heads {self.kv_heads}")
        if (self.hidden // self.heads) % 2:
            raise ValueError("the head size (hidden / heads) must be even for rotary embedding")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def param_count(self) -> int:
        """Exact number of weights (embedding, layers, final norm, LM head)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        layer = 2 * h + h * h + 2 * h * kv + h * h + 3 * h * self.mlp
        return self.vocab * h + self.layers * layer + h + h * self.vocab


@dataclass
class _Graph:
    """Collects nodes, external initializers (name, shape, offset) and small constants."""

    nodes: list = field(default_factory=list)
    weights: list = field(default_factory=list)  # (name, shape, offset, nbytes)
    consts: list = field(default_factory=list)
    offset: int = 0
    scope: str = ""  # the module the next nodes belong to, as torch's exporter names them
    _n: int = 0

    def name(self, base: str) -> str:
        self._n += 1
        return f"{base}_{self._n}"

    def weight(self, name: str, shape: list[int]) -> str:
        nbytes = 2 * math.prod(shape)
        self.weights.append((name, list(shape), self.offset, nbytes))
        self.offset += -(-nbytes // ALIGN) * ALIGN
        return name

    def const(self, base: str, values, dtype) -> str:
        name = self.name(base)
        self.consts.append(onnx.numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs, base: str | None = None, n_out: int = 1, **attrs):
        outs = [self.name(base or op_type.lower()) for _ in range(n_out)]
        name = f"{self.scope}/{self.name(op_type)}"
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs


def _rmsnorm(g: _Graph, x: str, d: int, name: str, eps) -> str:
    w = g.weight(name, [d])
    ms = g.op("ReduceMean", [g.op("Mul", [x, x])], axes=[-1], keepdims=1)
    inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [ms, eps])])])
    return g.op("Mul", [g.op("Mul", [x, inv]), w])


def _rotary(g: _Graph, x: str, cos: str, sin: str, half: str) -> str:
    """x * cos + rotate_half(x) * sin on [B, heads, S, head_dim]."""
    a, b = g.op("Split", [x, half], n_out=2, axis=-1)
    rot = g.op("Concat", [g.op("Neg", [b]), a], axis=-1)
    return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rot, sin])])


def _attention(g: _Graph, x: str, s: LlamaShape, i: int, c: dict) -> str:
    h, hd, nh, nkv = s.hidden, s.head_dim, s.heads, s.kv_heads
    q = g.op("MatMul", [x, g.weight(f"layers.{i}.attn.q_proj", [h, nh * hd])])
    k = g.op("MatMul", [x, g.weight(f"layers.{i}.attn.k_proj", [h, nkv * hd])])
    v = g.op("MatMul", [x, g.weight(f"layers.{i}.attn.v_proj", [h, nkv * hd])])

    def heads(t: str, n: int) -> str:
        shape = c["q_shape"] if n == nh else c["kv_shape"]
        return g.op("Transpose", [g.op("Reshape", [t, shape])], perm=[0, 2, 1, 3])

    qh = _rotary(g, heads(q, nh), c["cos"], c["sin"], c["half"])
    kh = _rotary(g, heads(k, nkv), c["cos"], c["sin"], c["half"])
    vh = heads(v, nkv)
    if nkv != nh:  # grouped-query attention: each KV head serves heads / kv_heads query heads

        def repeat(t: str) -> str:
            t = g.op("Unsqueeze", [t, c["axis2"]])
            t = g.op("Expand", [t, c["rep_shape"]])
            return g.op("Reshape", [t, c["q_heads_shape"]])

        kh, vh = repeat(kh), repeat(vh)
    scores = g.op("MatMul", [qh, g.op("Transpose", [kh], perm=[0, 1, 3, 2])])
    scores = g.op("Add", [g.op("Mul", [scores, c["scale"]]), c["mask"]])
    ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), vh])
    ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), c["merge_shape"]])
    return g.op("MatMul", [ctx, g.weight(f"layers.{i}.attn.o_proj", [nh * hd, h])])


def _mlp(g: _Graph, x: str, s: LlamaShape, i: int) -> str:
    gate = g.op("MatMul", [x, g.weight(f"layers.{i}.mlp.gate_proj", [s.hidden, s.mlp])])
    up = g.op("MatMul", [x, g.weight(f"layers.{i}.mlp.up_proj", [s.hidden, s.mlp])])
    act = g.op("Mul", [gate, g.op("Sigmoid", [gate])])  # SiLU
    return g.op(
        "MatMul", [g.op("Mul", [act, up]), g.weight(f"layers.{i}.mlp.down_proj", [s.mlp, s.hidden])]
    )


def _constants(g: _Graph, s: LlamaShape) -> dict:
    """Shapes, rotary tables and the causal mask (small fp16/int64 constants, stored inline)."""
    f16 = np.float16
    hd, S, B = s.head_dim, s.seq, s.batch
    inv = 1.0 / (10000.0 ** (np.arange(0, hd, 2) / hd))
    ang = np.outer(np.arange(S), inv)
    ang = np.concatenate([ang, ang], axis=1)
    rep = s.heads // s.kv_heads
    return {
        "eps": g.const("eps", 1e-5, f16),
        "cos": g.const("rope_cos", np.cos(ang), f16),
        "sin": g.const("rope_sin", np.sin(ang), f16),
        "half": g.const("half_split", [hd // 2, hd // 2], np.int64),
        "q_shape": g.const("q_shape", [B, S, s.heads, hd], np.int64),
        "kv_shape": g.const("kv_shape", [B, S, s.kv_heads, hd], np.int64),
        "axis2": g.const("axis2", [2], np.int64),
        "rep_shape": g.const("rep_shape", [B, s.kv_heads, rep, S, hd], np.int64),
        "q_heads_shape": g.const("q_heads_shape", [B, s.heads, S, hd], np.int64),
        "merge_shape": g.const("merge_shape", [B, S, s.hidden], np.int64),
        "scale": g.const("attn_scale", 1.0 / math.sqrt(hd), f16),
        "mask": g.const("causal_mask", np.triu(np.full((S, S), -1e4), 1), f16),
    }


def llama(s: LlamaShape, data_name: str) -> tuple[onnx.ModelProto, list]:
    """The ONNX model (weights external, at offsets into ``data_name``) and its weight table
    ``(name, shape, offset, nbytes)``."""
    g = _Graph()
    c = _constants(g, s)
    g.scope = "/model/embed_tokens"
    x = g.op("Gather", [g.weight("embed_tokens", [s.vocab, s.hidden]), "input_ids"], axis=0)
    for i in range(s.layers):
        g.scope = f"/model/layers.{i}"
        x = g.op(
            "Add",
            [x, _attention(g, _rmsnorm(g, x, s.hidden, f"layers.{i}.ln1", c["eps"]), s, i, c)],
        )
        x = g.op("Add", [x, _mlp(g, _rmsnorm(g, x, s.hidden, f"layers.{i}.ln2", c["eps"]), s, i)])
    g.scope = "/model/norm"
    x = _rmsnorm(g, x, s.hidden, "norm", c["eps"])
    g.scope = "/lm_head"
    logits = g.op("MatMul", [x, g.weight("lm_head", [s.hidden, s.vocab])], base="logits")
    inits = list(g.consts)
    for name, shape, offset, nbytes in g.weights:
        t = TensorProto(name=name, data_type=H, dims=shape)
        t.data_location = TensorProto.EXTERNAL
        for key, val in (("location", data_name), ("offset", offset), ("length", nbytes)):
            t.external_data.add(key=key, value=str(val))
        inits.append(t)
    graph = helper.make_graph(
        g.nodes,
        "llama",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [s.batch, s.seq])],
        [helper.make_tensor_value_info(logits, H, [s.batch, s.seq, s.vocab])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    model.producer_name = "mtpp-models-llama"
    return model, g.weights


def write(s: LlamaShape, out: Path, random_weights: bool = False, seed: int = 0) -> Path:
    """Write ``out`` and its sparse ``out.data`` (never materialised unless ``random_weights``).

    Both files are written under temporary names and renamed, so a failed build leaves nothing.
    """
    out = Path(out)
    data = out.with_name(out.name + ".data")
    model, weights = llama(s, data.name)
    total = weights[-1][2] + weights[-1][3] if weights else 0
    if random_weights and total > 1 << 30:
        raise ValueError("--random-weights is for small models (it writes every byte)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_data = data.with_name(f".{data.name}.{os.getpid()}.tmp")
    tmp_model = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp_data, "wb") as fh:
            fh.truncate(total)  # a hole: full size, no block written
            if random_weights:
                rng = np.random.default_rng(seed)
                for _, shape, offset, nbytes in weights:
                    fh.seek(offset)
                    scale = 1.0 / math.sqrt(shape[0])
                    arr = (rng.standard_normal(math.prod(shape)) * scale).astype(np.float16)
                    fh.write(arr.tobytes())
                    assert arr.nbytes == nbytes
        tmp_model.write_bytes(model.SerializeToString())
        os.replace(tmp_data, data)
        os.replace(tmp_model, out)
    finally:
        for t in (tmp_data, tmp_model):
            t.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--preset", choices=sorted(PRESETS), help="Llama-2 sizes (others override)")
    for f in ("layers", "hidden", "mlp", "heads", "kv-heads", "vocab"):
        ap.add_argument(f"--{f}", type=int)
    ap.add_argument("--seq", type=int, default=128, help="sequence length (default 128)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--random-weights", action="store_true", help="write seeded random weights")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True, help="the .onnx path (data beside it)")
    ap.add_argument("--force", action="store_true", help="replace existing output files")
    a = ap.parse_args(argv)
    sizes = dict(PRESETS.get(a.preset, {}))
    for f in ("layers", "hidden", "mlp", "heads", "kv_heads", "vocab"):
        if getattr(a, f) is not None:
            sizes[f] = getattr(a, f)
    try:
        shape = LlamaShape(**sizes, seq=a.seq, batch=a.batch)
    except ValueError as e:
        print(f"llama.py: error: {e}", file=sys.stderr)
        return 2
    data = a.out.with_name(a.out.name + ".data")
    for p in (a.out, data):
        if p.exists() and not a.force:
            print(f"llama.py: error: {p} exists; pass --force to replace it", file=sys.stderr)
            return 2
    try:
        write(shape, a.out, a.random_weights, a.seed)
    except (ValueError, OSError) as e:
        print(f"llama.py: error: {e}", file=sys.stderr)
        return 2
    print(f"{a.out}: {shape.param_count():,} parameters, weights in {data.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
