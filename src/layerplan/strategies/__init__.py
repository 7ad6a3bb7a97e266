"""The strategy registry, and predict(): strategy → StepGraph → cost engine → Prediction, with the
peak device memory of each role (a config that does not fit is infeasible)."""

from __future__ import annotations

from typing import Any

from layerplan.cost.compute import MemoryUse
from layerplan.errors import ConfigError
from layerplan.hardware import ClusterSpec
from layerplan.netspec.spec import NetSpec
from layerplan.strategies.allreduce import Allreduce
from layerplan.strategies.base import Strategy, StrategyPrediction
from layerplan.strategies.groups import Groups
from layerplan.strategies.hybrid import Hybrid
from layerplan.strategies.ps import PS
from layerplan.strategies.ralp import Ralp
from layerplan.strategies.stanza import Stanza

STRATEGIES: dict[str, Strategy] = {s.name: s for s in (PS(), Allreduce(), Stanza(), Ralp(), Groups(), Hybrid())}


def get(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ConfigError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}") from None


def memory(net: NetSpec, cluster: ClusterSpec, strategy: str, config: Any, batch: int) -> dict[str, MemoryUse]:
    """Role → peak device memory of one node of that role, at ``batch`` samples per worker."""
    if batch < 1:
        raise ConfigError(f"batch size must be at least 1, got {batch}")
    return get(strategy).memory(net, cluster, config, batch)


def memory_problem(net: NetSpec, cluster: ClusterSpec, strategy: str, config: Any, batch: int) -> str | None:
    """None when every role of ``config`` fits in the device's memory, else the one-line reason
    (other invalid configs raise ConfigError as ``predict`` does)."""
    return get(strategy).memory_problem(cluster, memory(net, cluster, strategy, config, batch))


def predict(net: NetSpec, cluster: ClusterSpec, strategy: str, config: Any, batch: int, *,
            check_memory: bool = True) -> StrategyPrediction:
    """The engine's Prediction for one strategy and config at ``batch`` samples per worker, with
    ``memory_per_role``. Raises ConfigError when the config is invalid or, with ``check_memory``
    (the default), when one of its roles needs more memory than the device has."""
    from layerplan.cost.engine import simulate

    if batch < 1:
        raise ConfigError(f"batch size must be at least 1, got {batch}")
    s = get(strategy)
    graph = s.schedule(net, cluster, config, batch)
    mem = s.memory(net, cluster, config, batch)
    if check_memory:
        why = s.memory_problem(cluster, mem)
        if why:
            raise ConfigError(why)
    return StrategyPrediction.of(simulate(graph, cluster), mem, cluster.device.memory_bytes)
