"""The options of every ``mtpp`` command (argparse), and nothing else: building them imports no
planner, so ``mtpp --help`` and a command's ``--help`` start at once. The commands themselves
are in one module each (solver.cli.solve, solver.cli.simulate, ...)."""

from __future__ import annotations

import argparse
import textwrap

from solver.core.cluster import MAX_DEVICES
from solver.pipeline.options import METHOD_OPTIONS

# mtpp export --format: the framework forms of solver.backends.frameworks.FORMATS, named here so
# that --help does not import the back end (tests/test_cli_frameworks.py checks they agree)
FRAMEWORK_FORMATS = ("torch", "torchtitan", "megatron", "deepspeed", "vllm")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs keep their line breaks (examples stay as written), and a long
    unindented line (a paragraph) is wrapped to the help width instead of running off screen."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            if len(line) > width and not line.startswith(" "):
                lines += textwrap.wrap(
                    line,
                    width,
                    initial_indent=indent,
                    subsequent_indent=indent,
                    break_on_hyphens=False,
                )
            else:
                lines.append(indent + line)
        return "\n".join(lines)


def formatter(prog: str) -> argparse.HelpFormatter:
    return _HelpFormatter(prog, max_help_position=32, width=100)


def devices_arg(text: str) -> int:
    """argparse type of ``--devices``: a whole number from 1 to :data:`MAX_DEVICES`."""
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of devices, got {text!r}"
        ) from None
    if not 1 <= k <= MAX_DEVICES:
        raise argparse.ArgumentTypeError(
            f"--devices must be >= 1 and at most {MAX_DEVICES}, got {text}"
        )
    return k


def add_graph_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("graph and cluster")
    g.add_argument(
        "--cluster",
        metavar="PRESET|FILE",
        help="cluster preset name (ipu-m2000, ipu-pod, ipu-pod16, dgx-a100, dgx-a100-x2) or a "
        "cluster YAML file; "
        "default: the cluster a plan records (a cluster given with such a plan must agree with "
        "it), else what the graph file states, else the ipu-pod preset",
    )
    g.add_argument(
        "--devices",
        "-k",
        type=devices_arg,
        metavar="K",
        help="number of devices k (overrides the cluster)",
    )
    g.add_argument(
        "--memory",
        metavar="SIZE",
        help="hard memory capacity C of every device, e.g. 40GB (overrides the cluster's "
        "capacity for every method; fast memory M, which prices streaming, is unchanged)",
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
    p.add_argument(
        "plan",
        metavar="PLAN",
        help="pipeline plan (mtpp solve --out) or manual-sharding YAML, whatever its file name",
    )


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def add_inspect_parser(sub) -> None:
    """Arguments of ``mtpp inspect``."""
    p = sub.add_parser(
        "inspect",
        help="summarise a graph: nodes, edges, work, parameters, heaviest operators",
        description="Summarise a graph file: sizes, total work and FLOPs, parameter and "
        "activation bytes, operator types, and the heaviest operators.",
        epilog="example:\n  mtpp inspect ../shared/benchmarks/dnn-partitioning/throughput-inputs/"
        "LayerGraphs/bert24_inference.json --json",
        formatter_class=formatter,
    )
    p.add_argument("graph", metavar="GRAPH", help="graph file (.onnx or .json)")
    p.add_argument("--top", type=int, default=10, help="heaviest operators to list (default 10)")
    p.add_argument(
        "--training-costs",
        action="store_true",
        help="also the backward work and the stash of training (docs/training.md; an ONNX "
        "model's come from its operator table): totals, and per heaviest operator",
    )
    add_graph_options(p)
    add_json(p)


def add_solve_parser(sub) -> None:
    """Arguments of ``mtpp solve``."""
    methods = ", ".join(METHOD_OPTIONS)  # every pipeline method, in the order of the table
    p = sub.add_parser(
        "solve",
        help="compute a plan with a chosen method (exact or heuristic)",
        description=textwrap.dedent(
            f"""\
            Compute a plan that minimises the bottleneck block cost max f(S) (maximises
            throughput). Methods: {methods};
            and joint (ONNX models: pipeline stages on sub-meshes, sharding inside; below).
            'cpsat' is exact: it proves a lower bound and reports OPTIMAL only with a proof;
            every other plan carries a certified lower bound too (docs/bounds.md), and is
            OPTIMAL only when that bound meets it."""
        ),
        epilog="examples:\n  mtpp solve graph.json --method cpsat --time-limit 30 --out plan.json\n"
        "  mtpp solve model.onnx --devices 4 --method slicegraph --json\n"
        "  mtpp solve model.onnx --method joint --cluster dgx-a100-x2 --memory 40GB --out j.json\n"
        "  mtpp solve gpt2.onnx --devices 4 --granularity layer --out layer_plan.json\n"
        "\n--method joint: pipeline stages, each on a sub-mesh of the cluster (inside one host, or "
        "whole hosts) sharding its operators; stage cost = its sharded program + transfers over "
        "the real links. Reports the slowest stage, a lower bound valid over the searched space "
        "(printed), a universal bound valid for every joint plan, and OPTIMAL only when the "
        "bound meets the plan. See docs/joint.md.",
        formatter_class=formatter,
    )
    p.add_argument("graph", metavar="GRAPH", help="graph file (.onnx or .json)")
    p.add_argument(
        "--method",
        "-m",
        default="cpsat",
        choices=[*METHOD_OPTIONS, "joint"],
        metavar="METHOD",
        help=f"solver: {methods} (default cpsat); or joint: pipeline stages on "
        "sub-meshes of the cluster, each sharding its operators (ONNX models only; "
        "--set space=joint|pipeline|sharding restricts the plans; docs/joint.md)",
    )
    p.add_argument(
        "--granularity",
        choices=["operator", "layer"],
        default="operator",
        help="operator: cut anywhere (default); layer: cut only between modules (the repeated "
        "blocks and the modules around them, read from the names torch's exporters record in "
        "an ONNX model), so that mtpp export --format "
        f"{'|'.join(FRAMEWORK_FORMATS)} can write the plan; the plan states what the "
        "restriction costs against the operator-level optimum (docs/frameworks.md)",
    )
    p.add_argument("--out", "-o", metavar="PLAN.json", help="write the plan here (atomically)")
    _add_search_options(p)
    _add_method_options(p)
    _add_training_options(p)
    add_graph_options(p)
    add_json(p)


def _add_search_options(p: argparse.ArgumentParser) -> None:
    """mtpp solve's search group: --time-limit, --workers, --seed, --gap, --quiet."""
    s = p.add_argument_group("search")
    s.add_argument(
        "--time-limit", type=float, default=60.0, metavar="SEC", help="wall-time limit (default 60)"
    )
    s.add_argument("--workers", type=int, default=0, help="CP-SAT workers (default: all cores)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    s.add_argument(
        "--gap",
        type=float,
        default=0.0,
        metavar="REL",
        help="stop once the relative gap is at most REL, e.g. 0.01 (default 0: prove optimality)",
    )
    s.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress on stderr (shown also with --json: a live line on a terminal, else "
        "a line on each better plan and every few seconds, none in the first 2 s)",
    )


def _add_method_options(p: argparse.ArgumentParser) -> None:
    """mtpp solve's options of one method: --optimal-perf, --sharding, --set."""
    m = p.add_argument_group("method options")
    m.add_argument(
        "--optimal-perf",
        action="store_true",
        help="poprt: keep balancing compute and return the best scheme (default: first that fits)",
    )
    m.add_argument("--sharding", metavar="FILE.yaml", help="manual: the sharding points")
    m.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a method option, e.g. --set population=50 --set generations=30 (slicegraph), "
        "--set max_ideals=100000 (idealdp), --set keep_best=5 (poprt); valid keys: "
        + "; ".join(f"{m}: {', '.join(o)}" for m, o in METHOD_OPTIONS.items() if o),
    )


def _add_training_options(p: argparse.ArgumentParser) -> None:
    """mtpp solve's training group: a training plan instead of an inference plan."""
    t = p.add_argument_group(
        "training",
        "a training plan (docs/training.md): the objective is the iteration time T of m "
        "microbatches forward and backward under the schedule, each stage's training memory "
        "within the capacity",
    )
    t.add_argument(
        "--schedule",
        choices=["gpipe", "1f1b", "interleaved"],
        help="plan training under this pipeline schedule (default: an inference plan)",
    )
    t.add_argument(
        "--microbatches", type=int, metavar="M", help="microbatches per iteration (default 1)"
    )
    t.add_argument(
        "--virtual-stages",
        type=int,
        metavar="V",
        help="interleaved: model chunks per device (default 1)",
    )
    t.add_argument(
        "--optimizer-state",
        type=float,
        metavar="FACTOR",
        help="bytes of training state per byte of weights: weights, gradients, optimizer state "
        "(default 4, fp32 Adam)",
    )


def add_evaluate_parser(sub) -> None:
    """Arguments of ``mtpp evaluate``."""
    p = sub.add_parser(
        "evaluate",
        help="cost of a given plan: objective and per-block table",
        description="Evaluate a plan on a graph with the one evaluator: per-block io, work, "
        "overflow, f(S), memory, and whether the plan is valid. The cluster is the one recorded "
        "in the plan (a --cluster given must agree with it), else --cluster, else the graph's; "
        "--devices and --memory re-evaluate the plan on that many devices or that capacity. "
        "The kind of plan is read from its content, whatever the file is called. The "
        "objective, validity and the universal lower bound are recomputed; the status and "
        "bound the file states are shown as claimed, and checked against the recomputed "
        "numbers. Exit code 1 when the plan is invalid or its claim does not check out.",
        epilog="example:\n  mtpp evaluate graph.json plan.json --json",
        formatter_class=formatter,
    )
    p.add_argument("graph", metavar="GRAPH", help="graph file (.onnx or .json)")
    p.add_argument(
        "plan",
        metavar="PLAN",
        nargs="?",
        help="the plan, whatever its file name: written by 'mtpp solve --out' (a pipeline or "
        "a joint plan), or a manual-sharding YAML (a list of {node, device, stage}); a joint "
        "plan is re-priced from its model and may be given alone: it names its model",
    )
    add_graph_options(p)
    add_json(p)


def add_simulate_parser(sub) -> None:
    """Arguments of ``mtpp simulate``."""
    p = sub.add_parser(
        "simulate",
        help="run a plan through a discrete-event pipeline simulation",
        description="Simulate requests flowing through the devices of a plan: steady-state "
        "period, throughput, latency, per-device busy/idle fractions and peak memory from "
        "liveness. Pipelined without --overlap, the period equals the plan's objective.",
        epilog="examples:\n  mtpp simulate graph.json plan.json --requests 1000\n"
        "  mtpp simulate model.onnx plan.json --mode sequential --gantt gantt.png --json\n"
        "  mtpp simulate joint.json --gantt gantt.png   # stages on sub-meshes (docs/joint.md)",
        formatter_class=formatter,
    )
    p.add_argument(
        "graph", metavar="GRAPH", help="graph file (.onnx or .json), or a joint plan JSON alone"
    )
    p.add_argument(
        "plan",
        metavar="PLAN",
        nargs="?",
        help="the plan, whatever its file name: a pipeline or joint plan (mtpp solve --out) or "
        "a manual-sharding YAML; a joint plan may be given alone: it names its model",
    )
    p.add_argument("--requests", type=int, default=100, help="requests to push (default 100)")
    p.add_argument(
        "--mode",
        choices=["pipelined", "sequential"],
        default="pipelined",
        help="pipelined: devices work on different requests at once; sequential: plain "
        "sharding, one device busy at a time (default pipelined)",
    )
    p.add_argument("--overlap", action="store_true", help="let transfers overlap compute")
    p.add_argument(
        "--latency", type=float, metavar="SEC", help="per-message link latency in seconds (>= 0)"
    )
    p.add_argument(
        "--gantt",
        metavar="FILE.png",
        help="draw devices x time bars to this file (format from the suffix: png, pdf, svg, ...); "
        "its folder must exist",
    )
    add_graph_options(p)
    add_json(p)


def add_export_parser(sub) -> None:
    """Arguments of ``mtpp export``."""
    p = sub.add_parser(
        "export",
        help="write the sharded ONNX model of a plan (and verify it)",
        description="Write, into a new folder: annotated.onnx (every node carries "
        "__ipu_number, the device its block is placed on, and __pipeline_stage, its stage), "
        "stage{s}.onnx (one model per stage with explicit "
        "boundary tensors; weights kept in external data are copied, holes skipped, into "
        "stage{s}.onnx.data, which annotated.onnx references too), sharding.yaml (PopRT-style "
        "manual sharding that --method manual reads back), stages.json (with the memory "
        "estimate). The folder appears whole or not at all. An existing "
        "empty folder is filled; a non-empty one is replaced only with --force.",
        epilog="examples:\n  mtpp export model.onnx plan.json --out sharded/ --verify\n"
        "  mtpp export model.onnx --plan joint.json --out stages/ --verify\n"
        "  mtpp export gpt2.onnx layer_plan.json --format torch --out pipeline/\n\n"
        "A joint plan (mtpp solve --method joint) is written as one folder per stage, "
        "stage_{s}/ with annotated.onnx (the stage's sub-model, strategies in metadata_props), "
        "strategies.yaml and plan.json (its sharded program, as mtpp shard --out writes them), "
        "plus plan.json, manifest.json and README.txt; --verify runs the stages one after the "
        "other, each on its emulated devices, and compares every stage's outputs and the "
        "model's with onnxruntime on the whole model (exit 1 naming the first stage and tensor "
        "beyond --tolerance, by default 1e-4 x max(1, max |reference|) for float32/float64, "
        "1e-2 x max(1, max |reference|) for float16/bfloat16, exact for integers and bools).",
        formatter_class=formatter,
    )
    p.add_argument(
        "graph",
        metavar="MODEL.onnx",
        help="the ONNX model the plan was made for (a joint plan may be given alone: it names "
        "its model)",
    )
    p.add_argument(
        "plan",
        metavar="PLAN",
        nargs="?",
        help="the plan, whatever its file name: a pipeline or a joint plan (mtpp solve --out), "
        "or a manual-sharding YAML",
    )
    p.add_argument(
        "--plan", dest="plan_option", metavar="PLAN", help="the plan, as an option instead"
    )
    p.add_argument(
        "--format",
        choices=["onnx", *FRAMEWORK_FORMATS, "dtensor"],
        default="onnx",
        help="onnx: the stage models above (default); torch: torch_pipeline.json (split_spec, "
        "stages); torchtitan: torchtitan_pipeline.json (module_fqns_per_model_part); megatron: "
        "megatron_layout.txt (last line: the --pipeline-model-parallel-layout string); "
        "deepspeed: deepspeed_partition.json (PipelineModule parts); vllm: "
        "vllm_pp_layer_partition.txt (VLLM_PP_LAYER_PARTITION); each with a README.md showing "
        "the call. The framework forms need a plan that cuts only between modules (mtpp solve "
        "--granularity layer) and take no --verify (docs/frameworks.md); dtensor: "
        "dtensor_plan.json (the parallelize_plan of an operator-sharding plan of mtpp shard, "
        "what does not map listed), or for a joint plan its (data, tensor, pipeline) layout "
        "with the split_spec and each stage's parallelize_plan",
    )
    _add_output_options(p)
    _add_verify_options(p)
    add_graph_options(p)
    add_json(p)


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """--out DIR and --force of mtpp export."""
    p.add_argument(
        "--out",
        "-o",
        required=True,
        metavar="DIR",
        help="output folder: new, or empty (a non-empty folder needs --force)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing non-empty output folder (only once the new one is complete); "
        "never the current folder, its parents, or a folder holding an input",
    )


def _add_verify_options(p: argparse.ArgumentParser) -> None:
    """--verify and what tunes it: --verify-memory-ok, --tolerance, --seed."""
    p.add_argument(
        "--verify",
        action="store_true",
        help="run the original and the chained stages in onnxruntime on seeded random inputs; "
        "exit 1 if an output differs in shape or dtype, has NaN, or differs by more than "
        "--tolerance. It needs about the model's weights plus activations in memory (the "
        "estimate is printed); when that exceeds the memory available now it refuses, naming "
        "both, unless --verify-memory-ok",
    )
    p.add_argument(
        "--verify-memory-ok",
        action="store_true",
        help="with --verify: run the check even when its memory estimate exceeds the memory "
        "available (the export itself never reads the weights into memory)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        metavar="TOL",
        help="largest absolute difference allowed on every output (default: by the output's "
        "type: 1e-4 for float32/float64, 1e-2 for float16/bfloat16, where stage and full "
        "sessions fuse ops differently, exact for integers and bools); the tolerance used "
        "for each output is in the report",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")


def add_run_parser(sub) -> None:
    """Arguments of ``mtpp run``."""
    p = sub.add_parser(
        "run",
        help="run a plan for real: one process per stage, joined by queues",
        description="Export the plan to a temporary folder, run every stage as its own "
        "process (one onnxruntime session, one thread each) joined by queues, push requests "
        "through, and report measured throughput and latency next to the simulator's "
        "prediction (node times measured on this machine, queue bandwidth as the link) and "
        "next to the unsplit model in one process with the same total threads.",
        epilog="examples:\n  mtpp run models/small/transformer.onnx plan.json --requests 200\n"
        "  mtpp run --backend torch --module gpt2.py:build gpt2.onnx layer_plan.json",
        formatter_class=formatter,
    )
    add_model_and_plan(p)
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        help="requests to push, 3 to 1,000,000 (default 100; onnx back end)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    _add_torch_run_options(p)
    p.add_argument(
        "--memory-ok",
        action="store_true",
        help="run even when the memory estimate (every stage's weights and activations at "
        "once, then the unsplit model, then the unsplit model profiled for the simulator's "
        "node times) exceeds the memory available; without it such a run is refused with "
        "the estimate",
    )
    add_graph_options(p)
    add_json(p)


def _add_torch_run_options(p: argparse.ArgumentParser) -> None:
    """--backend torch and what it takes (docs/frameworks.md)."""
    p.add_argument(
        "--backend",
        choices=["onnx", "torch"],
        default="onnx",
        help="onnx: the exported stage models in onnxruntime (default); torch: the module of "
        "--module split as the plan says, one process per stage joined by torch.distributed "
        "(gloo, CPU): a layer-granular plan with pipeline() and GPipe (one training step with "
        "--schedule or a training plan's schedule), an operator-sharding plan of mtpp shard "
        "in its DTensor form with parallelize_module; outputs (and gradients) checked against "
        'the unsplit module. Needs pip install "mtpp[torch]"',
    )
    p.add_argument(
        "--module",
        metavar="FILE.py:FACTORY",
        help="with --backend torch: a function in FILE.py that builds the torch module that "
        "was exported to MODEL.onnx (it takes the model's inputs, in order)",
    )
    p.add_argument(
        "--microbatches",
        type=int,
        default=None,
        metavar="M",
        help="with --backend torch: microbatches per step (default: a training plan's, else 4)",
    )
    p.add_argument(
        "--schedule",
        choices=["gpipe", "1f1b"],
        default=None,
        help="with --backend torch: run one training step under this schedule (default: the "
        "plan's, if it is a training plan; else inference, GPipe forward)",
    )


def add_experiment_parser(sub) -> None:
    """Arguments of ``mtpp experiment``."""
    p = sub.add_parser(
        "experiment",
        help="run a YAML experiment: methods x graphs x clusters x k, with reports",
        description="Run every combination of a YAML experiment config, in parallel processes "
        "on this machine (--backend local) or as Ray tasks (--backend ray: a local Ray instance, "
        "or the cluster at --address), and write results.jsonl, runs/, plans/, results.csv, "
        "summary.md and PNG plots into --output. Each finished run is saved at once by this "
        "process; Ctrl-C stops, keeps what finished and exits 130; --resume skips recorded runs "
        "(whichever backend recorded them). Locally each run gets max(1, cores / jobs) CP-SAT "
        "workers; on Ray a run asks for its method's 'cpus:' (CP-SAT default: a node's cores, "
        "at most 8). Paths in the config are resolved beside the config file, then in the "
        "current folder. dnn-partitioning graphs are read from the config's 'benchmark_dir:', "
        "else $MTPP_BENCH, else ../shared/benchmarks/dnn-partitioning beside the project.",
        epilog="examples:\n  mtpp experiment configs/experiments/smoke.yaml --output results/smoke"
        "\n  mtpp experiment configs/experiments/heuristic_vs_exact.yaml -o results/hve --jobs 2"
        " --resume"
        "\n  mtpp experiment configs/experiments/smoke.yaml -o results/smoke --backend ray"
        "\n  mtpp experiment configs/experiments/heuristic_vs_exact.yaml -o results/hve "
        "--backend ray --address HEAD_IP:6379",
        formatter_class=formatter,
    )
    p.add_argument("config", metavar="CONFIG.yaml", help="experiment config (configs/experiments)")
    p.add_argument(
        "--output",
        "-o",
        required=True,
        metavar="DIR",
        help="results folder: new or empty, or an unfinished one with --resume",
    )
    p.add_argument(
        "--jobs", "-j", type=int, default=None, help="local backend: runs in parallel (default 1)"
    )
    p.add_argument(
        "--backend",
        choices=["local", "ray"],
        default=None,
        help="local: a process pool on this machine; ray: one Ray task per run (needs the "
        "'ray' extra). Default: the config's 'backend:', else local",
    )
    p.add_argument(
        "--address",
        metavar="ADDRESS",
        default=None,
        help="with --backend ray: join the Ray cluster there (HOST:PORT, 'auto', or "
        "ray://HOST:10001); without it a local Ray instance is started on all cores",
    )
    p.add_argument("--resume", action="store_true", help="continue a folder, skip finished runs")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    add_json(p)


SHARD_EPILOG = """\
methods:
  propagate  sharding propagation (MindSpore, seed 002) from the configured operators (default)
  dp         data parallel: every operator splits its batch dim over all devices when it can
  megatron   Megatron-LM: weight MatMuls alternate column and row splits, then propagation
  cpsat      exact: every strategy of every operator under --memory; a Lagrangian relaxation
             of the memory limit solved exactly (variable elimination) bounds it and, with the
             three above, warm-starts CP-SAT; OPTIMAL only with a proof, else FEASIBLE + gap

examples:
  mtpp shard ffn.onnx --devices 8 --config ffn.yaml   # "dense1.matmul: [[2, 1], [1, 4]]"
  mtpp shard model.onnx --devices 8 --method cpsat --memory 1GB --time-limit 60
  mtpp shard model.onnx --devices 8 --mesh 2x4 --verify --json
  mtpp shard model.onnx --devices 4 --method cpsat --training --verify
  mtpp shard model.onnx --devices 8 --config s.yaml --out plan/
      (writes strategies.yaml, plan.json, annotated.onnx)

A strategy gives, for every data input of a node (weights included, shape inputs excluded), how
many slices each dimension is cut into; devices a strategy leaves unused replicate.
"""


def add_shard_parser(sub) -> None:
    """Arguments of ``mtpp shard``."""
    p = sub.add_parser(
        "shard",
        help="split single operators across devices (SPMD): propagation, patterns or exact",
        description="Operator-level sharding: choose a sharding strategy per operator "
        "(propagation of configured strategies, data parallel, Megatron, or the exact CP-SAT "
        "optimum under a memory limit), price every redistribution with ring collectives, and "
        "optionally run the sharded program on emulated devices to prove it computes what the "
        "model computes.",
        epilog=SHARD_EPILOG,
        formatter_class=formatter,
    )
    p.add_argument("model", metavar="MODEL.onnx", help="the ONNX model")
    p.add_argument("--devices", "-k", type=int, metavar="N", help="number of devices")
    p.add_argument("--mesh", metavar="AxB", help="logical device mesh, e.g. 2x4 (default: [N])")
    p.add_argument("--config", metavar="FILE", help="YAML of 'node name: [[2, 1], [1, 4]]'")
    p.add_argument(
        "--method",
        choices=["propagate", "dp", "megatron", "cpsat"],
        default="propagate",
        help="how strategies are chosen (see methods below; default propagate)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds for --method cpsat (default 60)",
    )
    p.add_argument("--workers", type=int, default=0, help="CP-SAT workers (default: all cores)")
    p.add_argument(
        "--cluster", metavar="PRESET|FILE", help="cluster preset or YAML (compute, link)"
    )
    p.add_argument("--memory", metavar="SIZE", help="memory per device, e.g. 16GiB")
    p.add_argument(
        "--training",
        action="store_true",
        help="plan a training step: each strategy's backward, gradient synchronisation "
        "(AllReduce or ZeRO-1) and training memory (docs/training.md)",
    )
    p.add_argument(
        "--optimizer-state",
        type=float,
        metavar="FACTOR",
        help="with --training: bytes of training state per byte of weights: weights, "
        "gradients, optimizer state (default 4, fp32 Adam)",
    )
    p.add_argument(
        "--dim", action="append", default=[], metavar="NAME=VALUE", help="fix a dynamic dim"
    )
    p.add_argument("--out", metavar="DIR", help="write strategies.yaml, plan.json, annotated.onnx")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out folder")
    p.add_argument("--verify", action="store_true", help="run the sharded program and compare")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of --verify's inputs and of CP-SAT (default 0)"
    )
    add_json(p)


def add_report_parser(sub) -> None:
    """Arguments of ``mtpp report``."""
    p = sub.add_parser(
        "report",
        help="write a plan as one self-contained HTML page (stages, bounds, graph, Gantt)",
        description="Write one HTML file (inline CSS and SVG: no script, no network) showing a "
        "plan: its stage table, per-stage bars of time (io, work, overflow) and memory, the "
        "graph or operator sequence coloured by stage, the bound ladder (each certified bound "
        "the plan records, the one that binds, its distance to the objective) and the "
        "schedule's Gantt chart. Pipeline, training, joint and sharded (mtpp shard) plans.",
        epilog="examples:\n  mtpp report plan.json model.onnx --html plan.html\n"
        "  mtpp report plan.json --html plan.html        # from the plan file alone\n"
        "  mtpp report joint.json --html joint.html      # a joint plan names its model\n"
        "  mtpp report shard_out/plan.json --html shard.html --force",
        formatter_class=formatter,
    )
    p.add_argument(
        "plan",
        metavar="PLAN",
        help="the plan, whatever its file name: pipeline or joint plan (mtpp solve --out), "
        "manual-sharding YAML, or a sharded plan (plan.json of mtpp shard --out)",
    )
    p.add_argument(
        "graph",
        metavar="MODEL",
        nargs="?",
        help="the graph or ONNX model the plan was made for: a pipeline plan needs it for the "
        "drawing of the graph and the simulated timeline (without it the page shows what the "
        "plan file records); a joint plan names its own",
    )
    p.add_argument("--html", metavar="FILE", required=True, help="the HTML file to write")
    p.add_argument("--force", action="store_true", help="replace an existing FILE")
    add_graph_options(p)
    add_json(p)
