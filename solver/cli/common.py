"""What every command shares: argument groups, loading graphs and plans, console and JSON."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import numpy as np

from solver.errors import MtppError


def formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32, width=100)


def add_graph_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("graph and cluster")
    g.add_argument(
        "--cluster",
        metavar="PRESET|FILE",
        help="cluster preset name (ipu-m2000, ipu-pod, dgx-a100) or a cluster YAML file; "
        "default: what the graph file states, else the ipu-pod preset",
    )
    g.add_argument(
        "--devices", "-k", type=int, metavar="K", help="number of devices k (overrides the cluster)"
    )
    g.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="ONNX only: fix a dynamic input dimension, e.g. --dim batch=8 (repeatable)",
    )
    g.add_argument(
        "--work",
        choices=["roofline", "flops", "measured"],
        default="roofline",
        help="ONNX only: node time model (default roofline on the cluster)",
    )


def add_model_and_plan(p: argparse.ArgumentParser) -> None:
    p.add_argument("graph", metavar="MODEL.onnx", help="the ONNX model the plan was made for")
    p.add_argument("plan", metavar="PLAN", help="plan JSON, or a manual-sharding YAML")


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def parse_dims(args: argparse.Namespace) -> dict[str, int]:
    dims = {}
    for item in args.dim:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise MtppError(f"--dim {item!r}: write NAME=VALUE, e.g. --dim batch=8")
        try:
            dims[name] = int(value)
        except ValueError:
            raise MtppError(f"--dim {item!r}: VALUE must be a whole number") from None
    return dims


def load_graph_and_cluster(args: argparse.Namespace):
    from solver.io import load_graph, resolve_cluster

    dims = parse_dims(args)
    options = {}
    if Path(args.graph).suffix.lower() == ".onnx":
        options = {
            "dims": dims,
            "work": args.work,
            "cluster": args.cluster,
            "devices": args.devices,
        }
    g = load_graph(args.graph, **options)
    cluster = resolve_cluster(g, args.cluster, args.devices)
    return g, cluster


def console():
    from rich.console import Console

    con = Console(highlight=False)
    if not con.is_terminal:  # pipes and files: do not squeeze tables into 80 columns
        con = Console(highlight=False, width=140)
    return con


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def esc(name: object) -> str:
    r"""A user-provided name made safe to print through rich: markup escaped, control
    characters shown as ``?`` (a node called ``[red]`` or holding an escape code prints as is).

    >>> print(esc("[red]x\x1b"))
    \[red]x?
    """
    from rich.markup import escape

    return escape(_CONTROL.sub("?", str(name)))


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.6g}"


def print_json(obj: dict) -> None:
    json.dump(obj, sys.stdout, indent=1, default=_json_default)
    sys.stdout.write("\n")


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o))


def plan_assignment(args, g, cluster):
    """The plan file (JSON or manual-sharding YAML) and the cluster to read it with."""
    from solver.cluster import cluster_from_dict
    from solver.plan import read_plan_assignment

    if Path(args.plan).suffix.lower() in (".yaml", ".yml"):
        from solver.heuristics.manual import manual_assignment, read_sharding

        a, stages = manual_assignment(g, read_sharding(args.plan))
        data = {"method": "manual", "stages": stages}
    else:
        a, data = read_plan_assignment(g, args.plan)
    if args.cluster is None and isinstance(data.get("cluster"), dict):
        cluster = cluster_from_dict(data["cluster"], f"cluster recorded in {args.plan}")
        cluster = cluster.with_devices(args.devices)
    if int(a.max()) + 1 > cluster.devices:
        raise MtppError(
            f"{args.plan}: the plan uses block {int(a.max())} but the cluster has "
            f"{cluster.devices} devices; pass --devices {int(a.max()) + 1}"
        )
    return a, data, cluster
