"""The ``mtpp`` command line: the options of every command in :mod:`solver.cli.parsers`, the
commands in one module each, assembled here.

Every command takes ``--json`` (one JSON object on stdout, nothing else there). A user mistake
ends with one line on stderr naming what to fix and exit code 2; an unexpected internal error
ends with one line naming the file that holds the full trace, and exit code 3.

Start-up: ``mtpp --help`` builds every parser but runs no command, so the parsers import no
planner, and a command's module (solver.cli.solve, solver.cli.shard, ...) is imported only when
that command runs (:func:`command_function`, the one place). Each command module then imports
what it needs at its top (planners, back ends, plan files), without lazy imports of ``solver.*``;
only external heavy packages (rich, matplotlib, onnx) stay inside the functions that use them.

The process's own run (:func:`main` without arguments: the ``mtpp`` script, ``python -m
solver.cli``) hands what it has loaded to the garbage collector's permanent generation twice
(``gc.freeze``): once the command's modules are imported, so that the collections during the
command do not walk them again, and when the command is done, so that the interpreter's
collections at exit skip everything (they took 0.1-0.15 s of CPU after a pipeline solve,
more once OR-Tools and pandas are loaded). Nothing else changes: files are closed by the
commands, ``atexit`` handlers run, threads are joined. A call with ``argv`` (tests, scripts)
leaves the collector alone.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from solver import __version__
from solver.cli import parsers
from solver.cli.parsers import formatter
from solver.core.errors import MtppError
from solver.core.text import CONTROL_CHARS

EPILOG_MAIN = """\
examples:
  mtpp inspect model.onnx
  mtpp solve graph.json --devices 4 --method cpsat --time-limit 60 --out plan.json
  mtpp evaluate graph.json plan.json --json

A GRAPH is an ONNX model (.onnx), an mtpp graph JSON, or a dnn-partitioning JSON.
Run 'mtpp COMMAND --help' for the options of one command.
"""


@dataclass(frozen=True)
class Command:
    """One command: its name, what adds its parser, and where it runs (``function`` of the
    module ``solver.cli.<module>``, imported when the command runs)."""

    name: str
    add_parser: Callable[[argparse._SubParsersAction], None]
    module: str
    function: str


# in the order --help lists them
COMMANDS = (
    Command("inspect", parsers.add_inspect_parser, "inspect_graph", "cmd_inspect"),
    Command("solve", parsers.add_solve_parser, "solve", "cmd_solve"),
    Command("evaluate", parsers.add_evaluate_parser, "evaluate", "cmd_evaluate"),
    Command("simulate", parsers.add_simulate_parser, "simulate", "cmd_simulate"),
    Command("export", parsers.add_export_parser, "export", "cmd_export"),
    Command("run", parsers.add_run_parser, "run", "cmd_run"),
    Command("experiment", parsers.add_experiment_parser, "experiment", "cmd_experiment"),
    Command("shard", parsers.add_shard_parser, "shard", "cmd_shard"),
    Command("report", parsers.add_report_parser, "report", "cmd_report"),
)


def command_function(name: str) -> Callable[[argparse.Namespace], int]:
    """The function that runs command ``name``; its module is imported now (see the top)."""
    command = next(c for c in COMMANDS if c.name == name)
    module = importlib.import_module(f"solver.cli.{command.module}")
    return getattr(module, command.function)


EXIT_USER, EXIT_INTERNAL, EXIT_INTERRUPTED = 2, 3, 130


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors that name the command and point to its --help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        message = " ".join(message.split())
        self.exit(EXIT_USER, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="mtpp",
        description="Split a neural-network graph across devices for maximum pipeline "
        "throughput, and prove how good the split is.",
        epilog=EPILOG_MAIN,
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    parser.set_defaults(_subparsers=sub.choices)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings reach the user as one plain line each, not Python's two-line format."""
    print(
        CONTROL_CHARS.sub("?", f"mtpp: warning: {' '.join(str(message).split())}"), file=sys.stderr
    )


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit code (0 ok, 2 user mistake, 3 our bug, 130 Ctrl-C).
    Without ``argv``: the process's own command line, the process ending next (module
    docstring)."""
    own_process = argv is None
    code = run_command(argv, own_process)
    if own_process:
        gc.freeze()  # the interpreter's collections at exit skip all of it (module docstring)
    return code


def run_command(argv: list[str] | None, own_process: bool = False) -> int:
    """:func:`main`'s work: parse ``argv`` (None: ``sys.argv``), run the command, turn every
    error into its one line and exit code; ``own_process``: freeze what the command's
    imports loaded before it runs (module docstring)."""
    warnings.showwarning = _show_warning
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # name the command whose options were misspelt, not just "mtpp"
            sub = args._subparsers.get(args.command, parser)
            sub.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # a one-line argparse error is returned; --help exits as before
        if e.code in (0, None):
            raise
        return e.code if isinstance(e.code, int) else EXIT_USER
    if args.version:
        print(f"mtpp {__version__}")
        return 0
    if not args.command:
        parser.print_usage()
        return _fail(
            f"mtpp: error: name a command: {', '.join(c.name for c in COMMANDS)} (see mtpp --help)",
            EXIT_USER,
        )
    try:
        command = command_function(args.command)
        if own_process:
            gc.freeze()  # loaded for good: later collections need not walk it (module docstring)
        code = command(args)
        sys.stdout.flush()  # a closed pipe must surface here, not at interpreter exit
        return code
    except MtppError as e:
        return _fail(f"mtpp: error: {e}", EXIT_USER)
    except KeyboardInterrupt:
        return _fail("mtpp: interrupted", EXIT_INTERRUPTED)
    except BrokenPipeError:
        # the reader went away (``mtpp ... --json | head -1``): what the Python docs advise
        # for SIGPIPE: point stdout at devnull so the final flush cannot fail again, exit 1
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except RecursionError:
        return _fail(
            f"mtpp: error: the input is nested too deeply for mtpp {args.command} to read",
            EXIT_USER,
        )
    except MemoryError:
        return _fail(
            f"mtpp: error: out of memory in mtpp {args.command}; the input is too large for "
            "this machine (use a smaller graph, fewer devices or smaller --dim values)",
            EXIT_USER,
        )
    except Exception as e:  # noqa: BLE001 -- the guard: one line and a saved trace
        return _fail(_internal_error(e, argv), EXIT_INTERNAL)


def _fail(line: str, code: int) -> int:
    """Print one line on stderr and return ``code``: newlines in a message (a node name may
    hold one) are folded and other control characters shown as ``?``, as :func:`esc` does."""
    print(CONTROL_CHARS.sub("?", " ".join(line.split())), file=sys.stderr)
    return code


def _internal_error(e: Exception, argv: list[str] | None) -> str:
    """The one line for a bug in mtpp; the full trace goes to a file in the temp folder."""
    first = (str(e).strip().splitlines() or [""])[0][:300]
    head = f"mtpp: internal error: {type(e).__name__}: {first}"
    try:
        fd, path = tempfile.mkstemp(prefix="mtpp-crash-", suffix=".txt")
        with os.fdopen(fd, "w") as fh:
            fh.write(f"mtpp {__version__}\nargv: {sys.argv[:1] + list(argv or sys.argv[1:])}\n\n")
            fh.write("".join(traceback.format_exception(e)))
    except OSError as err:
        return f"{head}; the full trace could not be saved ({err})"
    return f"{head}; full trace saved to {path}"


if __name__ == "__main__":
    sys.exit(main())
