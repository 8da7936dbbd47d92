"""Shared bits of the benchmark scripts: where the dnn-partitioning graphs are, known optima."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(os.environ.get("MTPP_BENCH", ROOT.parent / "shared/benchmarks/dnn-partitioning"))
INPUTS = BENCH / "throughput-inputs"

KNOWN = {  # README of the benchmark folder: optimum at the file's k (maxFPGAs)
    "LayerGraphs/bert24_inference": 17.78990625,
    "LayerGraphs/gnmt_inference": 32.910658203125,
    "LayerGraphs/resnet50_inference": 34.2228515625,
    "LayerGraphs/inceptionv3_inference": 52.2016,
    "OperatorGraphs/bert_l-3_inference": 27.9185676799125,
    "OperatorGraphs/bert_l-6_inference": 33.989101556140085,
    "OperatorGraphs/bert_l-12_inference": 147.47798444934838,
    "OperatorGraphs/resnet50_inference": 128.0735111041098,
}
TRAINING = [
    "LayerGraphs/bert24_training",
    "LayerGraphs/gnmt_training",
    "LayerGraphs/resnet50_training",
    "LayerGraphs/inceptionv3_training",
    "OperatorGraphs/bert_l-3_training",
    "OperatorGraphs/bert_l-6_training",
    "OperatorGraphs/bert_L-12_training",
    "OperatorGraphs/resnet50_training",
]


def path(key: str) -> Path:
    return INPUTS / f"{key}.json"
