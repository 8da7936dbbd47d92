"""mtpp evaluate: price a given plan (pipeline, training, joint or a manual sharding) and check
what its file claims against the recomputed numbers.

One path for every kind: the plan file is read and loaded (:func:`solver.cli.plan_files.
load_plan`), :func:`solver.backends.dispatch.evaluate` prices it again and decides its status,
and the record it returns is printed by its kind. Exit 1 when the plan is invalid or its file
claims what the numbers contradict.
"""

from __future__ import annotations

import argparse

from solver.backends import dispatch
from solver.backends.dispatch import Evaluated
from solver.cli.common import console, print_json
from solver.cli.plan_files import NOT_FOR_JOINT, command_plan, load_plan, refuse_for_kind
from solver.cli.solve import print_joint_plan, print_plan
from solver.core.text import esc


def cmd_evaluate(args: argparse.Namespace) -> int:
    plan_file = command_plan(args, "evaluate")
    refuse_for_kind(args, plan_file, NOT_FOR_JOINT)
    record = dispatch.evaluate(load_plan(args, plan_file))
    PRINTERS[record.kind](record, args.json)
    return 1 if record.violations or record.claim_refused else 0


def print_pipeline_evaluation(record: Evaluated, as_json: bool) -> None:
    """A pipeline plan: its recomputed bound and status, and its file's claim checked."""
    ev, plan, claim = record.detail, record.plan, record.claim
    if not as_json:
        print_plan(plan, ev.violations, title="evaluation", claim=claim)
        return
    out = plan.to_dict()
    out["valid"] = record.valid
    out["violations"] = [{"kind": v.kind, "message": v.message} for v in ev.violations]
    out["status_source"] = "claimed" if claim["used"] else "recomputed"
    out.update({key: val for key, val in claim.items() if key != "used"})
    out["method"] = ev.method[:200]
    del out["assignment"]
    print_json(out)


def print_joint_evaluation(record: Evaluated, as_json: bool) -> None:
    """A joint plan: every stage re-priced (the loader refuses a number that differs; a
    training plan by the training cost function, its T and per-stage F, B, t, sync, in-flight
    count and memory printed), the bound and status the file's, checked against the
    objective; INVALID when a stage does not fit."""
    plan, claimed = record.plan, record.claim["claimed_status"]
    if as_json:
        out = plan.to_dict()
        out.update(
            valid=record.valid,
            violations=record.violations,
            claimed_status=claimed,
            status_source="claimed" if record.claim["used"] else "recomputed",
            repriced=True,
        )
        print_json(out)
        return
    con = console()
    training = plan.training is not None
    con.print(f"[bold]evaluation[/bold] of a joint {'training ' if training else ''}plan")
    print_joint_plan(plan, con)
    priced = "for training (F, B, sync, memory, T) " if training else ""
    source = (
        f"the bound and the status ({esc(claimed)}) are the file's, checked against the "
        "objective"
        if record.claim["used"] or record.violations
        else f"the file's bound and status ({esc(claimed)}) cover a lower memory limit than "
        "--memory: the universal bound stands"
    )
    con.print(
        f"every stage re-priced {priced}from the model and the cluster: the file's numbers "
        f"match; {source}"
    )
    for v in record.violations:
        con.print(f"[red]invalid:[/red] {esc(v)}")


PRINTERS = {dispatch.PIPELINE: print_pipeline_evaluation, dispatch.JOINT: print_joint_evaluation}
