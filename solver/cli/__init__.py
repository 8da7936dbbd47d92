"""The ``mtpp`` command line: one module per command, assembled here.

Every command takes ``--json`` (one JSON object on stdout, nothing else there). A user mistake
ends with one line on stderr naming what to fix and exit code 2.
"""

from __future__ import annotations

import argparse
import sys

from solver.cli import experiment, export, inspect_graph, run, simulate, solve
from solver.cli.common import formatter
from solver.errors import MtppError

EPILOG_MAIN = """\
examples:
  mtpp inspect model.onnx
  mtpp solve graph.json --devices 4 --method cpsat --time-limit 60 --out plan.json
  mtpp evaluate graph.json plan.json --json

A GRAPH is an ONNX model (.onnx), an mtpp graph JSON, or a dnn-partitioning JSON.
Run 'mtpp COMMAND --help' for the options of one command.
"""

# (name, add its parser, run it), in the order --help lists them
COMMANDS = [
    ("inspect", inspect_graph.add_parser, inspect_graph.cmd_inspect),
    ("solve", solve.add_solve_parser, solve.cmd_solve),
    ("evaluate", solve.add_evaluate_parser, solve.cmd_evaluate),
    ("simulate", simulate.add_parser, simulate.cmd_simulate),
    ("export", export.add_parser, export.cmd_export),
    ("run", run.add_parser, run.cmd_run),
    ("experiment", experiment.add_parser, experiment.cmd_experiment),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mtpp",
        description="Split a neural-network graph across devices for maximum pipeline "
        "throughput, and prove how good the split is.",
        epilog=EPILOG_MAIN,
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for _, add, _ in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from solver import __version__

        print(f"mtpp {__version__}")
        return 0
    if not args.command:
        parser.print_help()
        return 2
    run_command = {name: fn for name, _, fn in COMMANDS}[args.command]
    try:
        return run_command(args)
    except MtppError as e:
        print(f"mtpp: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mtpp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
