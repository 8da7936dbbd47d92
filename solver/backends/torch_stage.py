"""One process of ``mtpp run --backend torch``: a pipeline stage (torch.distributed.pipelining)
or a tensor-parallel rank (DTensor ``parallelize_module``), joined to the others by gloo.

The driver (:mod:`solver.backends.torch_run`) starts one process per rank with a
:class:`RankTask`; the process writes what it measured and computed into the task's folder
(``rank{r}.json``, ``outputs.pt``, ``grads{r}.pt``) or, when it fails, one line into
``rank{r}.err``. torch is imported inside the functions: it is the heavy optional dependency of
the ``torch`` extra, and this module is imported by the driver before it knows torch is there.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from solver.backends.stage_worker import one_line

PIPELINE, TENSOR_PARALLEL = "pipeline", "tensor-parallel"
BANDWIDTH_BYTES = 4 * 2**20  # a gloo send/recv of this size measures the link between ranks


@dataclass(frozen=True)
class RankTask:
    """What every rank needs: the module, its weights and inputs, the split and the run."""

    kind: str  # PIPELINE or TENSOR_PARALLEL
    factory: str  # FILE.py:FACTORY
    folder: str  # weights.pt, inputs.pt in; rank files out
    world: int
    microbatches: int
    train: bool
    schedule: str  # gpipe or 1f1b (pipeline)
    repeats: int  # timed steps after one warm-up step
    threads: int  # torch threads per process
    split_spec: dict  # module path -> SplitPoint name (pipeline)
    parallelize_plan: dict  # module path -> style name (tensor-parallel)
    input_layouts: dict  # module path -> "Replicate" / "Shard(-1)" (tensor-parallel)
    output_layouts: dict  # module path -> "Replicate" (tensor-parallel)


@dataclass(frozen=True)
class RankReport:
    """What one rank measured: its step times (seconds) and the link bandwidth (bytes/s;
    0 where not measured)."""

    rank: int
    step_seconds: list[float]
    link_bandwidth: float


def load_factory(spec: str, where: str = "--module"):
    """The callable named by ``FILE.py:FACTORY`` (the file is imported under its own name)."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier():
        raise ValueError(
            f"{where} {spec}: expected FILE.py:FACTORY (a function that builds the torch module)"
        )
    if not Path(path).is_file():
        raise ValueError(f"{where} {spec}: {path} does not exist")
    mod_spec = importlib.util.spec_from_file_location(f"mtpp_user_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(mod_spec)
    try:
        mod_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file may raise anything
        raise ValueError(f"{where} {spec}: importing {path} failed: {one_line(e)}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ValueError(f"{where} {spec}: {path} defines no function {name}")
    return factory


def flat_tensors(value) -> list:
    """The tensors of a module's output, in order (tuples, lists, dicts, model outputs)."""
    import torch  # heavy: torch (the torch extra)

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in flat_tensors(item)]
    return []


def mse_loss(output, target):
    """The loss of a training step: mean squared error of the first output tensor."""
    import torch  # heavy: torch (the torch extra)

    return torch.nn.functional.mse_loss(flat_tensors(output)[0], target)


def rank_main(rank: int, task: RankTask) -> None:
    """Entry point of a rank process: run, write the results, or write the error in one line."""
    folder = Path(task.folder)
    try:
        report = _run_rank(rank, task)
        (folder / f"rank{rank}.json").write_text(json.dumps(asdict(report)))
    except BaseException as e:  # noqa: BLE001 - every failure goes to the driver in one line
        (folder / f"rank{rank}.err").write_text(one_line(e))
        traceback.print_exc(file=sys.stderr)
        sys.exit(1)


def _run_rank(rank: int, task: RankTask) -> RankReport:
    import torch  # heavy: torch (the torch extra)
    import torch.distributed as dist

    torch.set_num_threads(task.threads)
    folder = Path(task.folder)
    dist.init_process_group(
        "gloo", init_method=f"file://{folder / 'store'}", rank=rank, world_size=task.world
    )
    try:
        module = load_factory(task.factory)()
        module.load_state_dict(torch.load(folder / "weights.pt"))
        module.eval()  # no dropout: outputs and gradients comparable with the unsplit module
        data = torch.load(folder / "inputs.pt")
        if task.kind == PIPELINE:
            times = _pipeline_steps(rank, task, module, data)
        else:
            times = _tensor_parallel_steps(rank, task, module, data)
        bandwidth = _link_bandwidth(rank) if task.world > 1 else 0.0
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return RankReport(rank, times, bandwidth)


def _pipeline_steps(rank: int, task: RankTask, module, data: dict) -> list[float]:
    """The plan's split with pipeline() and one schedule step per repeat; the last stage
    saves the merged outputs, every stage its gradients (training)."""
    import torch  # heavy: torch (the torch extra)
    from torch.distributed.pipelining import (
        Schedule1F1B,
        ScheduleGPipe,
        SplitPoint,
        pipeline,
    )

    microbatches = data["microbatches"]
    spec = {path: SplitPoint[point] for path, point in task.split_spec.items()}
    pipe = pipeline(module, mb_args=tuple(microbatches[0]), split_spec=spec)
    if pipe.num_stages != task.world:
        raise RuntimeError(
            f"pipeline() made {pipe.num_stages} stages of the split_spec, the plan has {task.world}"
        )
    stage = pipe.build_stage(rank, torch.device("cpu"))
    schedule_class = Schedule1F1B if task.schedule == "1f1b" else ScheduleGPipe
    loss = mse_loss if task.train else None
    schedule = schedule_class(stage, task.microbatches, loss_fn=loss)
    full = [torch.cat(parts) for parts in zip(*microbatches, strict=True)]
    target = torch.cat(data["targets"]) if task.train else None
    last = rank == task.world - 1

    def step():
        args = full if rank == 0 else []
        kwargs = {"target": target, "losses": []} if task.train and last else {}
        return schedule.step(*args, **kwargs)

    times, out = _timed_steps(task, stage.submod, step)
    if last:
        torch.save([t.detach() for t in flat_tensors(out)], Path(task.folder) / "outputs.pt")
    _save_grads(rank, task, stage.submod)
    return times


def _tensor_parallel_steps(rank: int, task: RankTask, module, data: dict) -> list[float]:
    """parallelize_module with the plan's styles on a 1-D mesh of every rank; each repeat
    runs the microbatches forward (and backward for training)."""
    import torch  # heavy: torch (the torch extra)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    layouts = {"Replicate": Replicate(), "Shard(-1)": Shard(-1), "Shard(1)": Shard(1)}
    styles = {
        "ColwiseParallel": ColwiseParallel,
        "RowwiseParallel": RowwiseParallel,
        "SequenceParallel": SequenceParallel,
    }
    plan = {}
    for path, style in task.parallelize_plan.items():
        options = {}
        if path in task.input_layouts:
            options["input_layouts"] = layouts[task.input_layouts[path]]
        if path in task.output_layouts:
            options["output_layouts"] = layouts[task.output_layouts[path]]
        plan[path] = styles[style](**options)
    mesh = init_device_mesh("cpu", (task.world,))
    module = parallelize_module(module, mesh, plan)

    def step():
        outs = []
        for i, mb in enumerate(data["microbatches"]):
            out = module(*mb)
            if task.train:
                (mse_loss(out, data["targets"][i]) / task.microbatches).backward()
            outs.append(flat_tensors(out))
        return [torch.cat([_full(o[j]) for o in outs]) for j in range(len(outs[0]))]

    times, out = _timed_steps(task, module, step)
    if rank == 0:
        torch.save([t.detach() for t in out], Path(task.folder) / "outputs.pt")
    _save_grads(rank, task, module)
    return times


def _full(t):
    """A tensor whole on this rank (a DTensor output gathered)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _timed_steps(task: RankTask, module, step):
    """One warm-up step, then ``task.repeats`` timed ones (gradients zeroed before each, so
    the last step's gradients are one step's); returns the times and the last output."""
    import torch  # heavy: torch (the torch extra)
    import torch.distributed as dist

    times, out = [], None
    for repeat in range(task.repeats + 1):
        module.zero_grad(set_to_none=True)
        dist.barrier()
        start = time.perf_counter()
        with torch.set_grad_enabled(task.train):
            out = step()
        dist.barrier()
        if repeat:
            times.append(time.perf_counter() - start)
    return times, out


def _save_grads(rank: int, task: RankTask, module) -> None:
    """Every parameter's gradient of the last step, whole (DTensor shards gathered)."""
    import torch  # heavy: torch (the torch extra)

    if not task.train:
        return
    grads = {
        name: _full(p.grad).detach() for name, p in module.named_parameters() if p.grad is not None
    }
    torch.save(grads, Path(task.folder) / f"grads{rank}.pt")


def _link_bandwidth(rank: int, repeats: int = 3) -> float:
    """Bytes per second of a gloo send from rank 0 to rank 1 (0 on the other ranks)."""
    import torch  # heavy: torch (the torch extra)
    import torch.distributed as dist

    if rank > 1:
        return 0.0
    data = torch.zeros(BANDWIDTH_BYTES, dtype=torch.uint8)
    start = time.perf_counter()
    for _ in range(repeats):
        if rank == 0:
            dist.send(data, 1)
            dist.recv(data[:1], 1)
        else:
            dist.recv(data, 0)
            dist.send(data[:1], 0)
    return repeats * BANDWIDTH_BYTES / (time.perf_counter() - start) if rank == 0 else 0.0
