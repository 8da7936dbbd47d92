"""Export Hugging Face BERT and GPT-2 (built from a config, random weights) to ONNX via torch.

Needs torch and transformers (not dependencies of mtpp):

    pip install torch==2.13.0 transformers onnxscript
    python models/export_hf.py bert --exporter legacy --seq 128 --out models/generated/bert.onnx
    python models/export_hf.py gpt2 --exporter dynamo --layers 12
    python models/export_hf.py bert --layers 2 --hidden 128 --heads 2   # a small variant

Nothing is downloaded: the models are built from a config with random weights. The script
prints the model's parameter count (tied weights counted once, as torch counts them), which
``benchmarks/bench_onnx.py`` compares with what the importer finds.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path


def build(kind: str, layers: int, hidden: int, heads: int, vocab: int | None):
    """A randomly initialised BertModel or GPT2LMHeadModel in eval mode."""
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "bert":
        cfg = transformers.BertConfig(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
            vocab_size=vocab or 30522,
        )
        model = transformers.BertModel(cfg)
    elif kind == "gpt2":
        cfg = transformers.GPT2Config(
            n_layer=layers,
            n_embd=hidden,
            n_head=heads,
            vocab_size=vocab or 50257,
        )
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        raise ValueError(kind)
    model.config.use_cache = False
    # fresh biases are all zeros and LayerNorm weights all ones; exporters deduplicate equal
    # initializers, so give every parameter distinct random values to keep them apart
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.02)
    return model.eval()


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


def export(model, kind: str, seq: int, batch: int, out: Path, exporter: str) -> None:
    import torch

    vocab = model.config.vocab_size
    model = _wrapped(model)

    ids = torch.randint(0, vocab, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    args = (ids, mask)
    names = ["input_ids", "attention_mask"]
    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            torch.onnx.export(
                model,
                args,
                str(out),
                input_names=names,
                opset_version=17,
                do_constant_folding=True,
                dynamo=False,
            )
        else:
            prog = torch.onnx.export(model, args, input_names=names, dynamo=True, optimize=True)
            prog.save(str(out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("kind", choices=["bert", "gpt2"])
    ap.add_argument("--exporter", choices=["legacy", "dynamo"], default="legacy")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print(
            "this script needs torch and transformers: "
            "pip install torch==2.13.0 transformers onnxscript",
            file=sys.stderr,
        )
        return 2
    model = build(args.kind, args.layers, args.hidden, args.heads, args.vocab)
    out = args.out or Path(__file__).parent / "generated" / f"{args.kind}-{args.exporter}.onnx"
    export(model, args.kind, args.seq, args.batch, out, args.exporter)
    print(f"{out}: {parameter_count(model)} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
