"""Shared bits of the benchmark scripts: where the dnn-partitioning graphs are, known optima."""

from __future__ import annotations

from pathlib import Path

from solver.experiments import DNNPART, DNNPART_KNOWN

INPUTS = DNNPART / "throughput-inputs"

KNOWN = DNNPART_KNOWN  # the optima at the file's k, kept in one place
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
