"""mtpp evaluate: price a given plan (pipeline, joint or a manual sharding) and check what its
file claims against the recomputed numbers."""

from __future__ import annotations

import argparse
import math

from solver.backends.simulate_joint import simulate_joint
from solver.cli.common import console, print_json
from solver.cli.plan_files import (
    JOINT,
    cluster_difference,
    command_plan,
    load_joint,
    load_pipeline_plan,
    refuse_pipeline_options,
)
from solver.cli.solve import print_joint_plan, print_plan
from solver.core.cost import validate
from solver.core.result import claim_problem
from solver.core.text import esc
from solver.pipeline import registry  # registry.certified_bound: tests patch it there
from solver.pipeline.plan import (
    FEASIBLE,
    INVALID,
    OPTIMAL,
    make_plan,
)


def _number(x: object) -> bool:
    """A finite int or float (not a bool, not an int too large for a float)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def check_claim(plan, data: dict, recorded_cluster) -> dict:
    """Compare what a plan file claims (status, lower bound, objective) with the recomputed
    numbers (the honest-status rule, :func:`solver.core.result.claim_problem`). The claim is
    "consistent" or says why not; it is ``used`` for the status only when consistent, made
    for this cluster (by content: the name may differ), and its bound proves that status."""
    status, bound, obj = data.get("status"), data.get("lower_bound"), data.get("objective")
    res = data.get("optimal_within")
    res = float(res) if _number(res) else 0.0
    out = {
        "claimed_status": status[:40] if isinstance(status, str) else None,
        "claimed_lower_bound": float(bound) if _number(bound) else None,
        "claimed_objective": float(obj) if _number(obj) else None,
        "claimed_optimal_within": res or None,
        "claim": "consistent",
        "used": False,
    }
    if status is None and bound is None:
        out["claim"] = "none (the file states no status or bound)"
        return out
    why = None
    if recorded_cluster is None or cluster_difference(recorded_cluster, plan.cluster):
        why = "not applicable: evaluated on another cluster than the plan was made for"
    else:
        problem = claim_problem(plan.objective, status, bound, obj, res)
        why = None if problem is None else f"invalid: {problem}"
    if why is not None:
        out["claim"] = why
        return out
    out["used"] = out["claimed_status"] == OPTIMAL
    return out


EVALUATE_BOUND_SECONDS = 10.0  # time for the certified bounds of a plan being evaluated (the
# exact chain DP needs 4-7 s on a 7B decoder at k = 64; small graphs finish at once)


def cmd_evaluate(args: argparse.Namespace) -> int:
    plan_file = command_plan(args, "evaluate")
    if plan_file.kind == JOINT:
        return cmd_evaluate_joint(args, plan_file)
    p = load_pipeline_plan(args, plan_file)
    g, cluster, data = p.graph, p.cluster, p.data
    violations = validate(g, cluster, p.assignment, placement=p.placement)
    method = data.get("method") if isinstance(data.get("method"), str) else "given"
    # the bound is recomputed (the certified bounds, as solve computes them); an invalid plan
    # gets none, since bounds speak of valid plans only. OPTIMAL when the bound meets the plan.
    rep = None if violations else registry.certified_bound(g, cluster, EVALUATE_BOUND_SECONDS)
    plan = make_plan(
        g,
        cluster,
        p.assignment,
        method,
        status=FEASIBLE if rep is None else OPTIMAL,
        check=False,
        lower_bound=None if rep is None else rep.value,
        placement=p.placement,
    )
    if rep is not None:
        plan.stats["bound"] = registry.bound_stats(rep)
    proven = plan.status == OPTIMAL
    claim = check_claim(plan, data, p.recorded)
    if violations:
        plan.status = INVALID
        claim["used"] = False
    elif proven:
        claim["used"] = False  # the recomputed bound proves the status; no claim is needed
    elif claim["used"]:
        plan.status = OPTIMAL
    bad_claim = claim["claim"].startswith("invalid")
    if args.json:
        out = plan.to_dict()
        out["valid"] = not violations
        out["violations"] = [{"kind": v.kind, "message": v.message} for v in violations]
        out["status_source"] = "claimed" if claim["used"] else "recomputed"
        out.update({key: val for key, val in claim.items() if key != "used"})
        out["method"] = method[:200]
        del out["assignment"]
        print_json(out)
    else:
        print_plan(plan, violations, title="evaluation", claim=claim)
    return 1 if violations or bad_claim else 0


def cmd_evaluate_joint(args: argparse.Namespace, plan_file) -> int:
    """``mtpp evaluate [MODEL.onnx] joint.json``: every stage re-priced from the model and the
    cluster (a number that differs is refused with one line), then checked against the memory
    limit by the joint simulator. The bound is the file's (stated over its space): it is
    checked against the objective, not recomputed. Exit 1 when a stage does not fit."""
    refuse_pipeline_options(args, {"--work": "roofline"})
    joint = load_joint(args, plan_file)
    plan = joint.plan
    violations = list(simulate_joint(plan, joint.model, requests=2).sim.violations)
    claimed = plan.status
    if violations:
        plan.status = INVALID
    if args.json:
        out = plan.to_dict()
        out.update(
            valid=not violations,
            violations=violations,
            claimed_status=claimed,
            status_source="claimed" if not violations else "recomputed",
            repriced=True,
        )
        print_json(out)
        return 1 if violations else 0
    con = console()
    con.print("[bold]evaluation[/bold] of a joint plan")
    print_joint_plan(plan, con)
    con.print(
        "every stage re-priced from the model and the cluster: the file's numbers match; the "
        f"bound and the status ({esc(claimed)}) are the file's, checked against the objective"
    )
    for v in violations:
        con.print(f"[red]invalid:[/red] {esc(v)}")
    return 1 if violations else 0
