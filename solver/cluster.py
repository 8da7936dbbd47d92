"""The cluster: k devices with fast memory, optional hard capacity, compute and bandwidths.

Presets live in ``configs/clusters/*.yaml`` (shipped inside the package as ``solver/presets``).
A YAML file or preset is validated with pydantic; quantities accept readable units.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from solver.errors import MtppError
from solver.files import read_yaml
from solver.units import format_bytes, format_rate, format_time, parse_quantity

PRESET_DIR = Path(__file__).resolve().parent / "presets"
DEFAULT_PRESET = "ipu-pod"


@dataclass(frozen=True)
class Cluster:
    """k devices; every quantity in base units (bytes, FLOP/s, bytes/s, seconds).

    ``fast_memory`` is M (SRAM / HBM; what does not fit streams at ``slow_memory_bandwidth``,
    B_mem); ``capacity`` is the optional hard limit C; ``link_bandwidth`` is B.

    >>> c = Cluster(name="toy", devices=2, fast_memory=1e6, link_bandwidth=1e9)
    >>> c.devices, c.capacity
    (2, None)
    """

    name: str
    devices: int
    fast_memory: float = math.inf
    capacity: float | None = None
    compute: float = 1e12
    memory_bandwidth: float = 1e12
    link_bandwidth: float = 1e9
    slow_memory_bandwidth: float = 1e9
    link_latency: float = 0.0
    description: str = ""

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise MtppError(f"cluster {self.name!r}: devices must be >= 1, got {self.devices}")
        for f in ("compute", "memory_bandwidth", "link_bandwidth", "slow_memory_bandwidth"):
            v = getattr(self, f)
            if not v > 0:
                raise MtppError(f"cluster {self.name!r}: {f} must be > 0, got {v}")
        if self.fast_memory < 0 or (self.capacity is not None and self.capacity < 0):
            raise MtppError(f"cluster {self.name!r}: memory sizes must be >= 0")

    def with_devices(self, k: int | None) -> Cluster:
        """The same cluster with ``k`` devices (unchanged when ``k`` is None)."""
        if k is None:
            return self
        if k < 1:
            raise MtppError(f"--devices must be >= 1, got {k}")
        return replace(self, devices=int(k))

    def to_dict(self) -> dict:
        d = asdict(self)
        for key, val in d.items():
            if isinstance(val, float) and math.isinf(val):
                d[key] = "inf"
        return d

    def summary(self) -> str:
        """One line naming the cluster and its key figures."""
        cap = "none" if self.capacity is None else format_bytes(self.capacity)
        return (
            f"{self.name}: {self.devices} devices, fast memory {format_bytes(self.fast_memory)}, "
            f"capacity {cap}, link {format_rate(self.link_bandwidth, 'B/s')}, "
            f"slow memory {format_rate(self.slow_memory_bandwidth, 'B/s')}, "
            f"compute {format_rate(self.compute, 'FLOPS')}"
            + (f", link latency {format_time(self.link_latency)}" if self.link_latency else "")
        )


class ClusterConfig(BaseModel):
    """The YAML schema of a cluster file; unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    description: str = ""
    devices: int = 4
    fast_memory: str | float = "inf"
    capacity: str | float | None = None
    compute: str | float = 1e12
    memory_bandwidth: str | float = 1e12
    link_bandwidth: str | float = 1e9
    slow_memory_bandwidth: str | float = 1e9
    link_latency: str | float = 0.0

    @field_validator("devices")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError("must be >= 1")
        return v

    def to_cluster(self, default_name: str) -> Cluster:
        def q(field: str, kind: str) -> float:
            return parse_quantity(getattr(self, field), kind, field)

        return Cluster(
            name=self.name or default_name,
            devices=self.devices,
            fast_memory=q("fast_memory", "bytes"),
            capacity=None if self.capacity is None else q("capacity", "bytes"),
            compute=q("compute", "flops"),
            memory_bandwidth=q("memory_bandwidth", "bandwidth"),
            link_bandwidth=q("link_bandwidth", "bandwidth"),
            slow_memory_bandwidth=q("slow_memory_bandwidth", "bandwidth"),
            link_latency=q("link_latency", "time"),
            description=self.description,
        )


def preset_names() -> list[str]:
    """Names of the shipped cluster presets."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def cluster_from_dict(data: object, where: str) -> Cluster:
    """Validate a mapping (from YAML or an experiment config) into a :class:`Cluster`."""
    if not isinstance(data, dict):
        raise MtppError(f"{where}: a cluster must be a mapping of keys to values")
    try:
        cfg = ClusterConfig.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        raise MtppError(f"{where}: key {loc!r}: {err['msg']}") from None
    return cfg.to_cluster(Path(where).stem)


def load_cluster(spec: str | Path | None = None, devices: int | None = None) -> Cluster:
    """A preset name or a YAML file path -> :class:`Cluster`; ``devices`` overrides k.

    >>> load_cluster("ipu-m2000").devices
    4
    >>> load_cluster(None, devices=8).name
    'ipu-pod'
    """
    spec = DEFAULT_PRESET if spec is None else str(spec)
    path = Path(spec)
    if not path.suffix and (PRESET_DIR / f"{spec}.yaml").exists():
        path = PRESET_DIR / f"{spec}.yaml"
    elif not path.exists():
        raise MtppError(
            f"cluster {spec!r}: no such file or preset; presets are {', '.join(preset_names())}"
        )
    data = read_yaml(path, "cluster file")
    return cluster_from_dict(data, str(path)).with_devices(devices)
