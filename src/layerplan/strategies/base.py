"""What every strategy is: a frozen Config, the space of valid configs, and a schedule — a StepGraph
that says which tasks run on which node group, which bytes cross which NICs, and what depends on
what. Strategies never compute a step time: the cost engine does (ARCHITECTURE.md principle 1)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Mapping, Sequence

from layerplan.cost import compute
from layerplan.cost.compute import MemoryUse
from layerplan.cost.engine import Prediction, StepGraph
from layerplan.errors import ConfigError
from layerplan.hardware import ClusterSpec
from layerplan.netspec.spec import LayerSpec, NetSpec


class Strategy(ABC):
    """Base of the six strategies. Subclasses set ``name``, ``Config`` and ``summary`` and implement
    ``check``, ``space``, ``default`` and ``schedule``."""

    name: ClassVar[str]
    Config: ClassVar[type]
    summary: ClassVar[str]
    needs_fc_phase: ClassVar[bool] = False

    # ---- what a strategy must say ------------------------------------------------------------
    @abstractmethod
    def check(self, net: NetSpec, cluster: ClusterSpec, config: Any) -> None:
        """Raise ConfigError (with the reason) when ``config`` cannot run ``net`` on ``cluster``."""

    @abstractmethod
    def space(self, net: NetSpec, cluster: ClusterSpec, batch: int) -> list[Any]:
        """Valid configs worth ranking on this cluster."""

    @abstractmethod
    def default(self, net: NetSpec, cluster: ClusterSpec, batch: int, **options: Any) -> Any:
        """The config the CLI builds from --workers/--servers/... (None = let the strategy choose)."""

    @abstractmethod
    def schedule(self, net: NetSpec, cluster: ClusterSpec, config: Any, batch: int) -> StepGraph:
        """Each subclass implements it."""

    @abstractmethod
    def global_batch(self, config: Any, batch: int) -> int:
        """Each subclass implements it."""

    @abstractmethod
    def roles(self, config: Any) -> dict[str, int]:
        """Role name → number of nodes in that role."""

    @abstractmethod
    def memory(self, net: NetSpec, cluster: ClusterSpec, config: Any, batch: int) -> dict[str, MemoryUse]:
        """Role → peak device memory of one node of that role (``compute.MemoryUse``)."""

    role_labels: ClassVar[Mapping[str, str]] = {}
    """Role → how a person names one node of it in messages ("the FC worker")."""

    # ---- shared behaviour ---------------------------------------------------------------------
    def applies(self, net: NetSpec) -> str | None:
        """None when the strategy applies to ``net``, else the reason it does not."""
        if self.needs_fc_phase and net.boundary is None:
            return f"{self.name} needs an FC phase after the conv layers, and {net.name} has none"
        return None

    def require_applies(self, net: NetSpec) -> None:
        why = self.applies(net)
        if why:
            raise ConfigError(why)

    def role_label(self, role: str) -> str:
        return self.role_labels.get(role, f"a {role} node")

    def memory_problem(self, cluster: ClusterSpec, memory: Mapping[str, MemoryUse]) -> str | None:
        """None when every role fits in ``cluster.device``'s memory, else a one-line reason naming
        the role that overflows the most, its need and the capacity (Stanza §4.2: an assignment
        must fit the GPUs' memory)."""
        over = [(m.total_bytes / cluster.device.memory_bytes, role, m) for role, m in memory.items()
                if m.total_bytes > cluster.device.memory_bytes]
        if not over:
            return None
        _, role, m = max(over, key=lambda x: x[0])
        try:
            compute.check_fits(m.total_bytes, cluster.device, f"{self.name}: {self.role_label(role)}", m.describe())
        except ConfigError as e:  # check_fits words the message; it raises for every role in ``over``
            return str(e)
        return None

    def config_from_dict(self, data: dict[str, Any]) -> Any:
        names = {f.name for f in fields(self.Config)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"{self.name}: unknown config key(s) {', '.join(unknown)}; expected {', '.join(sorted(names))}")
        try:
            return self.Config(**data)
        except TypeError as e:
            raise ConfigError(f"{self.name}: {e}") from None

    @staticmethod
    def config_to_dict(config: Any) -> dict[str, Any]:
        d = asdict(config)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


LEAD_ROUNDS = 4
"""Steps a schedule simulates where workers run ahead of others — those whose pulls arrived first
(``LinkSpec.flow_lead_bytes``, ``stagger_shares``): the step time is the mean over the last two
(engine.simulate; with 4 groups of workers 8 steps give the same to 0.01%)."""

STAGGER_GROUPS = 4
"""Groups of workers a schedule simulates where their pulls leave one NIC together and arrive one
after another (``LinkSpec.stagger_shares``)."""


def stagger_groups(workers: int, groups: int = STAGGER_GROUPS) -> list[int]:
    """``workers`` in up to ``groups`` groups of near-equal size, the smaller first (the first
    pulls served)."""
    m = max(1, min(workers, groups))
    return [workers // m + (j >= m - workers % m) for j in range(m)]


def require_nodes(name: str, needed: int, cluster: ClusterSpec, what: str) -> None:
    if needed > cluster.nodes:
        raise ConfigError(f"{name}: {what} need {needed} nodes, the cluster has {cluster.nodes}")


def require_positive(name: str, **values: int) -> None:
    for k, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{name}: {k.replace('_', '-')} must be at least 1, got {v!r}")


def fwd_s(net: NetSpec, layers: Sequence[LayerSpec], cluster: ClusterSpec, batch: int) -> float:
    """Forward time of ``layers`` for ``batch`` samples on one device (PALEO §3.1.1)."""
    return compute.phase_time_s(net, layers, cluster.device, batch, "fwd")


def bwd_s(net: NetSpec, layers: Sequence[LayerSpec], cluster: ClusterSpec, batch: int) -> float:
    """Backward time (input-grad + weight-grad) of ``layers`` for ``batch`` samples (PALEO §3.1.1)."""
    return compute.phase_time_s(net, layers, cluster.device, batch, "bwd")


def sum_passes(gradients: int, averaged: bool = False, copied: bool = False) -> int:
    """Passes over the parameter bytes (each a read or a write of all of them) a server makes to
    sum the ``gradients`` it received (``runtime.roles.summed``: per add, read two and write one;
    one gradient is used as it came) and, ``averaged``, to divide the sum by their number, and,
    ``copied``, to copy it into the parameters' gradients (a read and a write each) — PALEO §3.1.1's
    R + W terms of these elementwise passes."""
    if gradients <= 1:
        return 2 if copied else 0
    return 3 * (gradients - 1) + (2 if averaged else 0) + (2 if copied else 0)


def update_s(param_bytes: float, cluster: ClusterSpec, gradients_summed: int = 1, *, averaged: bool = False,
             copied: bool = False) -> float:
    """SGD-with-momentum update: read the gradient, parameters and momentum, write parameters and
    momentum (5 passes), after summing ``gradients_summed`` received gradients (``sum_passes``)
    — memory bound (PALEO §3.1.1 R + W terms), at the bandwidth an update of this size sees
    (``DeviceSpec.update_bytes_per_s``: caches for small ones, DRAM for large), the sum's at the
    bandwidth a sum sees (``DeviceSpec.sum_bytes_per_s``). A server summing 4 gradients of
    vgg16_cifar's 135 MB and dividing them took 108–111 ms here and the update 34 ms, where 5 + 1
    pass per gradient at the update's bandwidth had charged 48 ms for both."""
    dev = cluster.device
    return (5 * param_bytes / dev.update_bytes_per_s(param_bytes)
            + sum_passes(gradients_summed, averaged=averaged, copied=copied) * param_bytes / dev.sum_bytes_per_s(param_bytes))


def copy_s(nbytes: float, cluster: ClusterSpec, passes: int = 1, model_bytes: float | None = None) -> float:
    """Memory time of ``passes`` copies of ``nbytes`` (each a read and a write of them) at the
    bandwidth an update of ``model_bytes`` (default ``nbytes``) sees — PALEO §3.1.1's R + W terms,
    as ``update_s``. A worker that sends or all-reduces its gradient as one flat vector gathers it
    first (``runtime.roles.flat_grads``: one copy), and one that receives its parameters so copies
    them into its model (``runtime.roles.set_params``: one copy); a flat gradient received or
    reduced becomes the parameters' gradients as views of it (``set_grads``: no copy)."""
    if nbytes <= 0:
        return 0.0
    return 2.0 * passes * nbytes / cluster.device.update_bytes_per_s(model_bytes or nbytes)


def param_bytes(layers: Sequence[LayerSpec]) -> int:
    return sum(layer.param_bytes for layer in layers)


@dataclass(frozen=True, kw_only=True, slots=True)
class StrategyPrediction(Prediction):
    """The engine's Prediction plus the peak device memory of one node of each role."""

    memory_per_role: dict[str, MemoryUse] = field(default_factory=dict)
    """Role → peak memory of one node, by part (``compute.MemoryUse``)."""
    device_memory_bytes: float = 0.0
    """Memory of one device of the cluster (what each role's peak is checked against)."""

    @property
    def memory_bytes_per_role(self) -> dict[str, float]:
        """Role → peak device memory of one node, bytes."""
        return {r: m.total_bytes for r, m in self.memory_per_role.items()}

    def to_dict(self) -> dict[str, Any]:
        d = Prediction.to_dict(self)
        d["memory_bytes_per_role"] = self.memory_bytes_per_role
        d["memory_per_role"] = {r: m.to_dict() for r, m in self.memory_per_role.items()}
        d["device_memory_bytes"] = self.device_memory_bytes
        return d

    @classmethod
    def of(cls, pred: Prediction, memory: Mapping[str, MemoryUse], device_memory_bytes: float) -> "StrategyPrediction":
        return cls(**{f.name: getattr(pred, f.name) for f in fields(Prediction)}, memory_per_role=dict(memory),
                   device_memory_bytes=float(device_memory_bytes))


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """One strategy × config the planner ranks."""

    strategy: str
    config: Any
    why: str = ""
