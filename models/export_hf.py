"""Export Hugging Face models (built from a config, random weights) to ONNX via torch: BERT,
GPT-2, a ViT, a diffusers U-Net and a Mixtral mixture-of-experts decoder, optionally
quantized to int8.

Needs torch and transformers (not dependencies of mtpp), and diffusers for the U-Net:

    pip install torch==2.13.0 transformers onnxscript diffusers
    python models/export_hf.py bert --exporter legacy --seq 128 --out models/generated/bert.onnx
    python models/export_hf.py gpt2 --exporter dynamo --layers 12
    python models/export_hf.py bert --layers 2 --hidden 128 --heads 2   # a small variant
    python models/export_hf.py vit --layers 2 --hidden 64 --heads 2 --image 32 --patch 8
    python models/export_hf.py vit --layers 2 --hidden 64 --heads 2 --image 32 --patch 8 --int8
    python models/export_hf.py unet --layers 1 --hidden 32 --heads 8 --image 8 --seq 6
    python models/export_hf.py unet-sd --layers 2 --hidden 64 --heads 8 --image 32 --seq 77
    python models/export_hf.py moe --layers 2 --hidden 32 --heads 2 --vocab 128 --seq 8
    python models/export_hf.py t5 --layers 6 --hidden 512 --heads 8 --seq 64   # T5-small-shaped
    python models/export_hf.py whisper --layers 12 --hidden 768 --heads 12 --image 64 --seq 32
    python models/export_hf.py inception --layers 2 --hidden 32 --image 64   # Inception-v3-like
    python models/export_hf.py moe-parallel --layers 4 --hidden 256 --heads 4 --experts 8 --seq 64

Nothing is downloaded: the models are built from a config with random weights. The script
prints the model's parameter count (tied weights counted once, as torch counts them), which
``benchmarks/bench_onnx.py`` compares with what the importer finds.

Per kind, ``--layers`` is the number of transformer layers (U-Net: layers per block),
``--hidden`` the width (U-Net: channels of the first block, doubled in the second, and the
text-embedding width), ``--heads`` the attention heads (U-Net: the width of one head), ``--seq``
the tokens (U-Net: text tokens), ``--image`` the image side (U-Net: latent side). ``--int8``
quantizes the weights of MatMul, Gemm and Conv with onnxruntime's ``quantize_dynamic``
(MatMulInteger, ConvInteger, DynamicQuantizeLinear). The MoE decoder routes each token to
``--top-k`` of ``--experts`` experts; ``--experts-impl batched_mm`` (default) gathers the
chosen experts' weights (static shapes), ``eager`` loops over the experts the example tokens
hit, which the tracing exporter freezes: that export is valid for every input only when
``--top-k`` equals ``--experts``. The encoder-decoders (t5, bart, whisper) have ``--layers``
encoder and as many decoder layers and take ``--seq`` tokens on both sides (Whisper:
``--image`` audio positions, twice as many mel frames, and ``--seq`` decoder tokens); they
return the decoder's last hidden state.

Two models are plain torch modules built from these sizes (no Hugging Face config exists for
them). ``inception``: an Inception-v3-like network on ``--image`` x ``--image`` pixels: a
convolution stem of width ``--hidden``, then three stages of ``--layers`` mixed blocks each
(35x35-style blocks of four parallel branches, 17x17-style blocks with factorised 1x7 / 7x1
branches, 8x8-style blocks with split 1x3 / 3x1 heads), each stage after the first opened by
a grid reduction (stride-2 branches and a max pool concatenated), and an average pool and a
classifier. ``moe-parallel``: a transformer of ``--layers`` pre-norm layers (``--heads``
heads, width ``--hidden``, ``--seq`` tokens) whose feed-forward is ``--experts`` parallel
expert MLPs (width 2 x hidden) run on every token and mixed by a softmax router keeping the
``--top-k`` largest gates per token: every expert reads the same normalised hidden state and
the router's gates, so the graph has ``--experts`` parallel branches per layer.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

KINDS = ("bert", "gpt2", "vit", "unet", "unet-sd", "moe", "t5", "bart", "whisper", "inception")
KINDS += ("moe-parallel",)
ENCODER_DECODERS = ("t5", "bart", "whisper")  # --layers encoder and decoder layers each


@dataclass
class Sizes:
    """The sizes a model is built with (see the module docstring for what each means)."""

    layers: int
    hidden: int
    heads: int
    vocab: int | None = None
    image: int = 224
    patch: int = 16
    experts: int = 4
    top_k: int = 2
    experts_impl: str = "batched_mm"


@dataclass
class Example:
    """A module to export with its example inputs, in order, and their names."""

    module: object
    args: tuple
    names: list[str]


def build(kind: str, layers: int, hidden: int, heads: int, vocab: int | None, **more):
    """A randomly initialised model of ``kind`` in eval mode (``more``: the other fields of
    :class:`Sizes`)."""
    import torch

    torch.manual_seed(0)
    sizes = Sizes(layers, hidden, heads, vocab, **more)
    builders = {"bert": _bert, "gpt2": _gpt2, "vit": _vit, "unet": _unet, "moe": _moe}
    builders.update(t5=_t5, bart=_bart, whisper=_whisper)
    builders.update({"unet-sd": _unet_sd, "inception": _inception, "moe-parallel": _moe_parallel})
    if kind not in builders:
        raise ValueError(kind)
    model = builders[kind](sizes)
    if hasattr(getattr(model, "config", None), "use_cache"):
        model.config.use_cache = False
    # fresh biases are all zeros and LayerNorm weights all ones; exporters deduplicate equal
    # initializers, so give every parameter distinct random values to keep them apart
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.02)
    return model.eval()


def _bert(s: Sizes):
    import transformers

    cfg = transformers.BertConfig(
        num_hidden_layers=s.layers,
        hidden_size=s.hidden,
        num_attention_heads=s.heads,
        intermediate_size=4 * s.hidden,
        vocab_size=s.vocab or 30522,
    )
    return transformers.BertModel(cfg)


def _gpt2(s: Sizes):
    import transformers

    cfg = transformers.GPT2Config(
        n_layer=s.layers, n_embd=s.hidden, n_head=s.heads, vocab_size=s.vocab or 50257
    )
    return transformers.GPT2LMHeadModel(cfg)


def _vit(s: Sizes):
    import transformers

    cfg = transformers.ViTConfig(
        num_hidden_layers=s.layers,
        hidden_size=s.hidden,
        num_attention_heads=s.heads,
        intermediate_size=4 * s.hidden,
        image_size=s.image,
        patch_size=s.patch,
    )
    return transformers.ViTModel(cfg)


def _unet(s: Sizes):
    import diffusers

    return diffusers.UNet2DConditionModel(
        sample_size=s.image,
        in_channels=4,
        out_channels=4,
        layers_per_block=s.layers,
        block_out_channels=(s.hidden, 2 * s.hidden),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=s.hidden,
        attention_head_dim=s.heads,
        norm_num_groups=min(32, s.hidden // 4),
    )


def _unet_sd(s: Sizes):
    """Stable Diffusion 1.5's block layout (three cross-attention levels and a plain one, down
    and up, widths h, 2h, 4h, 4h), at the width ``--hidden`` instead of 320."""
    import diffusers

    return diffusers.UNet2DConditionModel(
        sample_size=s.image,
        in_channels=4,
        out_channels=4,
        layers_per_block=s.layers,
        block_out_channels=(s.hidden, 2 * s.hidden, 4 * s.hidden, 4 * s.hidden),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        cross_attention_dim=s.hidden,
        attention_head_dim=s.heads,
        norm_num_groups=min(32, s.hidden // 4),
    )


def _moe(s: Sizes):
    import transformers

    cfg = transformers.MixtralConfig(
        num_hidden_layers=s.layers,
        hidden_size=s.hidden,
        intermediate_size=2 * s.hidden,
        num_attention_heads=s.heads,
        num_key_value_heads=s.heads,
        num_local_experts=s.experts,
        num_experts_per_tok=s.top_k,
        vocab_size=s.vocab or 32000,
        max_position_embeddings=4096,
        experts_implementation=s.experts_impl,
    )
    return transformers.MixtralForCausalLM(cfg)


def _inception(s: Sizes):
    """Inception-v3-like stack (see the module docstring); widths scale with ``s.hidden``."""
    import torch
    from torch import nn

    def conv(cin: int, cout: int, kernel, stride: int = 1, padding=0) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
        )

    class Mixed(nn.Module):
        """Parallel branches over one input, concatenated along the channels."""

        def __init__(self, branches: list[nn.Module]):
            super().__init__()
            self.branches = nn.ModuleList(branches)

        def forward(self, x):
            return torch.cat([b(x) for b in self.branches], dim=1)

    def block_a(cin: int, w: int) -> Mixed:  # 35x35: 1x1, 5x5, double 3x3, pool
        return Mixed(
            [
                conv(cin, w, 1),
                nn.Sequential(conv(cin, w, 1), conv(w, w, 5, padding=2)),
                nn.Sequential(conv(cin, w, 1), conv(w, w, 3, padding=1), conv(w, w, 3, padding=1)),
                nn.Sequential(nn.AvgPool2d(3, 1, 1), conv(cin, w, 1)),
            ]
        )

    def block_b(cin: int, w: int) -> Mixed:  # 17x17: 1x1, 1x7-7x1, double 7x1-1x7, pool
        def seven(n: int) -> list[nn.Module]:  # alternating 1x7 and 7x1 convolutions
            shapes = [((1, 7), (0, 3)), ((7, 1), (3, 0))]
            return [conv(w, w, kern, padding=pad) for kern, pad in (shapes * n)[:n]]

        return Mixed(
            [
                conv(cin, w, 1),
                nn.Sequential(conv(cin, w, 1), *seven(2)),
                nn.Sequential(conv(cin, w, 1), *seven(4)),
                nn.Sequential(nn.AvgPool2d(3, 1, 1), conv(cin, w, 1)),
            ]
        )

    class SplitHead(nn.Module):
        """A 1x3 and a 3x1 convolution of one input, concatenated (Inception-v3's 8x8 heads)."""

        def __init__(self, cin: int, w: int):
            super().__init__()
            self.a = conv(cin, w, (1, 3), padding=(0, 1))
            self.b = conv(cin, w, (3, 1), padding=(1, 0))

        def forward(self, x):
            return torch.cat([self.a(x), self.b(x)], dim=1)

    def block_c(cin: int, w: int) -> Mixed:  # 8x8: 1x1, split head, 3x3 + split head, pool
        return Mixed(
            [
                conv(cin, w, 1),
                nn.Sequential(conv(cin, w, 1), SplitHead(w, w)),
                nn.Sequential(conv(cin, w, 1), conv(w, w, 3, padding=1), SplitHead(w, w)),
                nn.Sequential(nn.AvgPool2d(3, 1, 1), conv(cin, w, 1)),
            ]
        )

    def reduction(cin: int, w: int) -> Mixed:  # stride-2 branches and a max pool
        return Mixed(
            [
                conv(cin, w, 3, stride=2, padding=1),
                nn.Sequential(conv(cin, w, 1), conv(w, w, 3, padding=1), conv(w, w, 3, 2, 1)),
                nn.MaxPool2d(3, 2, 1),
            ]
        )

    h = s.hidden
    layers: list[nn.Module] = [conv(3, h // 2, 3, 2, 1), conv(h // 2, h, 3, padding=1)]
    cin = h
    for stage, (make, w) in enumerate(((block_a, h // 2), (block_b, h), (block_c, 2 * h))):
        if stage > 0:
            layers.append(reduction(cin, w))
            cin = 2 * w + cin
        for _ in range(s.layers):
            layers.append(make(cin, w))
            cin = 6 * w if make is block_c else 4 * w
    features = nn.Sequential(*layers)
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000))
    model = nn.Sequential(features, head)
    model.image_side = s.image  # the example input's side
    return model


def _moe_parallel(s: Sizes):
    """A transformer whose feed-forward is ``s.experts`` parallel experts behind a top-k
    softmax router (see the module docstring)."""
    import torch
    from torch import nn

    d, heads = s.hidden, s.heads

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

        def forward(self, x):
            b, n, _ = x.shape

            def split(t):
                return t.view(b, n, heads, d // heads).transpose(1, 2)

            q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
            att = torch.softmax(q @ k.transpose(-1, -2) / (d // heads) ** 0.5, dim=-1)
            return self.o((att @ v).transpose(1, 2).reshape(b, n, d))

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(d, s.experts)
            self.experts = nn.ModuleList(
                nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
                for _ in range(s.experts)
            )

        def forward(self, x):
            probs = torch.softmax(self.router(x), dim=-1)
            top, idx = probs.topk(s.top_k, dim=-1)
            gates = torch.zeros_like(probs).scatter(-1, idx, top / top.sum(-1, keepdim=True))
            out = 0
            for e, expert in enumerate(self.experts):
                out = out + gates[..., e : e + 1] * expert(x)
            return out

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn, self.moe = Attention(), Experts()

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.moe(self.norm2(x))

    class ParallelExperts(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(s.vocab or 32000, d)
            self.layers = nn.ModuleList(Layer() for _ in range(s.layers))
            self.norm = nn.LayerNorm(d)

        def forward(self, input_ids):
            x = self.embed(input_ids)
            for layer in self.layers:
                x = layer(x)
            return self.norm(x)

    return ParallelExperts()


def _t5(s: Sizes):
    import transformers

    cfg = transformers.T5Config(
        num_layers=s.layers,
        num_decoder_layers=s.layers,
        d_model=s.hidden,
        d_ff=4 * s.hidden,
        num_heads=s.heads,
        d_kv=s.hidden // s.heads,
        vocab_size=s.vocab or 32128,
    )
    return transformers.T5Model(cfg)


def _bart(s: Sizes):
    import transformers

    cfg = transformers.BartConfig(
        encoder_layers=s.layers,
        decoder_layers=s.layers,
        d_model=s.hidden,
        encoder_attention_heads=s.heads,
        decoder_attention_heads=s.heads,
        encoder_ffn_dim=4 * s.hidden,
        decoder_ffn_dim=4 * s.hidden,
        vocab_size=s.vocab or 50265,
    )
    return transformers.BartModel(cfg)


def _whisper(s: Sizes):
    import transformers

    cfg = transformers.WhisperConfig(
        encoder_layers=s.layers,
        decoder_layers=s.layers,
        d_model=s.hidden,
        encoder_attention_heads=s.heads,
        decoder_attention_heads=s.heads,
        encoder_ffn_dim=4 * s.hidden,
        decoder_ffn_dim=4 * s.hidden,
        num_mel_bins=80,
        max_source_positions=s.image,  # audio frames after the stride-2 convolution
        vocab_size=s.vocab or 51865,
    )
    return transformers.WhisperModel(cfg)


def _seq2seq_wrapped(model, source: str):
    """An encoder-decoder called on its source (token ids, or audio features for Whisper)
    and the decoder's token ids, returning the decoder's last hidden state."""
    import torch

    class Seq2Seq(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, src, decoder_input_ids):
            out = self.inner(
                **{source: src}, decoder_input_ids=decoder_input_ids, return_dict=False
            )
            return out[0]

    return Seq2Seq(model).eval()


def parameter_count(model) -> int:
    """Parameters as torch counts them: a tied tensor once."""
    return sum(p.numel() for p in model.parameters())


def _wrapped(model):
    """The model called with keyword arguments, returning its main output only (exporters
    pass positional tensors, which recent transformers signatures do not take in order)."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)
            return (
                tuple(out[:2])
                if len(out) > 1 and out[1] is not None and out[1].dim() == 2
                else out[0]
            )  # BERT: hidden states and pooled output (keeps the pooler alive)

    return Wrapped(model).eval()


def _vision_wrapped(model):
    """A ViT called on pixels, returning its hidden states and pooled output."""
    import torch

    class Vision(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values):
            out = self.inner(pixel_values=pixel_values, return_dict=False)
            return tuple(out[:2])

    return Vision(model).eval()


def _unet_wrapped(model):
    """A U-Net called on a latent, a timestep and text embeddings, returning the noise."""
    import torch

    class Denoiser(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, sample, timestep, encoder_hidden_states):
            return self.inner(
                sample, timestep, encoder_hidden_states=encoder_hidden_states, return_dict=False
            )[0]

    return Denoiser(model).eval()


def example(model, kind: str, seq: int, batch: int) -> Example:
    """The module to export and its example inputs."""
    import torch

    if kind == "vit":
        side = model.config.image_size
        pixels = torch.randn(batch, model.config.num_channels, side, side)
        return Example(_vision_wrapped(model), (pixels,), ["pixel_values"])
    if kind in ("unet", "unet-sd"):
        cfg = model.config
        latent = torch.randn(batch, cfg.in_channels, cfg.sample_size, cfg.sample_size)
        text = torch.randn(batch, seq, cfg.cross_attention_dim)
        names = ["sample", "timestep", "encoder_hidden_states"]
        return Example(_unet_wrapped(model), (latent, torch.tensor([10]), text), names)
    if kind == "inception":
        pixels = torch.randn(batch, 3, model.image_side, model.image_side)
        return Example(model, (pixels,), ["pixel_values"])
    if kind == "moe-parallel":
        ids = torch.randint(0, model.embed.num_embeddings, (batch, seq))
        return Example(model, (ids,), ["input_ids"])
    if kind in ENCODER_DECODERS:
        vocab = model.config.vocab_size
        target = torch.randint(0, vocab, (batch, seq))
        if kind == "whisper":  # mel features: two frames per encoder position
            feats = torch.randn(batch, 80, 2 * model.config.max_source_positions)
            return Example(
                _seq2seq_wrapped(model, "input_features"),
                (feats, target),
                ["input_features", "decoder_input_ids"],
            )
        ids = torch.randint(0, vocab, (batch, seq))
        names = ["input_ids", "decoder_input_ids"]
        return Example(_seq2seq_wrapped(model, "input_ids"), (ids, target), names)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    return Example(_wrapped(model), (ids, mask), ["input_ids", "attention_mask"])


def export(model, kind: str, seq: int, batch: int, out: Path, exporter: str) -> None:
    import torch

    ex = example(model, kind, seq, batch)
    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            torch.onnx.export(
                ex.module,
                ex.args,
                str(out),
                input_names=ex.names,
                opset_version=17,
                do_constant_folding=True,
                dynamo=False,
            )
        else:
            prog = torch.onnx.export(
                ex.module, ex.args, input_names=ex.names, dynamo=True, optimize=True
            )
            prog.save(str(out))


def quantize_int8(src: Path, out: Path) -> None:
    """``src`` with its MatMul/Gemm/Conv weights quantized to int8 (onnxruntime's dynamic
    quantization: activations are quantized at run time), written to ``out``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--exporter", choices=["legacy", "dynamo"], default="legacy")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--image", type=int, default=224, help="image side (U-Net: latent side)")
    ap.add_argument("--patch", type=int, default=16, help="ViT patch side")
    ap.add_argument("--experts", type=int, default=4, help="MoE experts")
    ap.add_argument("--top-k", type=int, default=2, help="MoE experts per token")
    ap.add_argument("--experts-impl", choices=["batched_mm", "eager"], default="batched_mm")
    ap.add_argument("--int8", action="store_true", help="quantize the weights to int8")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401

        if args.kind in ("unet", "unet-sd"):
            import diffusers  # noqa: F401
    except ImportError:
        print(
            "this script needs torch and transformers (and diffusers for unet): "
            "pip install torch==2.13.0 transformers onnxscript diffusers",
            file=sys.stderr,
        )
        return 2
    more = {"image": args.image, "patch": args.patch, "experts": args.experts}
    more.update(top_k=args.top_k, experts_impl=args.experts_impl)
    model = build(args.kind, args.layers, args.hidden, args.heads, args.vocab, **more)
    suffix = "-int8" if args.int8 else ""
    default = Path(__file__).parent / "generated" / f"{args.kind}-{args.exporter}{suffix}.onnx"
    out = args.out or default
    if args.int8:
        with tempfile.TemporaryDirectory() as tmp:
            fp32 = Path(tmp) / "fp32.onnx"
            export(model, args.kind, args.seq, args.batch, fp32, args.exporter)
            out.parent.mkdir(parents=True, exist_ok=True)
            quantize_int8(fp32, out)
    else:
        export(model, args.kind, args.seq, args.batch, out, args.exporter)
    print(f"{out}: {parameter_count(model)} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
