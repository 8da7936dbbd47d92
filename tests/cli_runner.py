"""Running the command line inside a test: the exit code and what it printed."""

from __future__ import annotations

from solver.cli import main


def run(capsys, *argv) -> tuple[int, str, str]:
    """``mtpp ARGV...`` in this process: (exit code, stdout, stderr) of that call."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_cli(capsys, argv) -> tuple[int, str, str]:
    """As :func:`run` with the arguments as one list, after dropping what was printed before."""
    capsys.readouterr()
    return run(capsys, *argv)
