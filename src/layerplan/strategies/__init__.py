"""The strategy registry, and predict(): strategy → StepGraph → cost engine → Prediction."""

from __future__ import annotations

from typing import Any

from layerplan.errors import ConfigError
from layerplan.hardware import ClusterSpec
from layerplan.netspec.spec import NetSpec
from layerplan.strategies.allreduce import Allreduce
from layerplan.strategies.base import Strategy
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


def predict(net: NetSpec, cluster: ClusterSpec, strategy: str, config: Any, batch: int):
    """The engine's Prediction for one strategy and config at ``batch`` samples per worker."""
    from layerplan.cost.engine import simulate

    if batch < 1:
        raise ConfigError(f"batch size must be at least 1, got {batch}")
    s = get(strategy)
    graph = s.schedule(net, cluster, config, batch)
    return simulate(graph, cluster)
