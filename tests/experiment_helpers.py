"""What the experiment tests share: a fast sweep, writing its config, running the command."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from solver.cli import main

FAST = {
    "name": "fast",
    "graphs": [{"layered": 30, "params": {"width": 3}}],
    "devices": [2, 3],
    "methods": ["time", "uniform"],
    "time_limit": 1,
}


def write(folder: Path, data: dict, name: str = "exp.yaml") -> Path:
    """``data`` as a YAML config in ``folder`` (created if needed); its path."""
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text(yaml.safe_dump(data))
    return p


def run_cli(*argv) -> int:
    """``mtpp experiment ARGV -q --json``; its exit code."""
    return main(["experiment", *map(str, argv), "-q", "--json"])


def jsonl_ids(out: Path) -> list[str]:
    """The run ids of ``results.jsonl`` in ``out``, in file order."""
    return [json.loads(line)["id"] for line in (out / "results.jsonl").read_text().splitlines()]
