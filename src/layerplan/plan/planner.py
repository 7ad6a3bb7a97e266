"""The cross-strategy planner: every strategy × its candidate configs, through the one cost
engine, ranked by predicted throughput; and the Plan file that `train --plan` executes.

Candidates come from each strategy's own optimizer where the papers give one (Stanza's node
assignment by eq.3–5, ranked in closed form first; RALP's profiler split; the number of PS shards
from eq.6) and from the strategy's space otherwise. Only the finalists are simulated, so planning
a 1,024-node cluster stays well under a second.

Configs that cannot run are skipped, with the reason: a role whose peak memory exceeds the
device's (``strategies.predict`` checks every role, PALEO/Stanza memory), or any other
ConfigError. ``rank`` returns a ``Ranking`` (a list) whose ``skipped`` maps "strategy config" to
that reason; ``why_not`` gives the same reasons (memory only, nothing simulated) when told the
batch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Sequence

from layerplan import strategies
from layerplan.errors import ConfigError, LayerplanError, SpecError
from layerplan.hardware import ClusterSpec, cluster_from_dict
from layerplan.netspec.spec import NetSpec

STANZA_FINALISTS = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class Ranked:
    """One strategy × config with its prediction."""

    strategy: str
    config: Any
    prediction: Any
    """The engine's Prediction."""

    @property
    def throughput(self) -> float:
        return self.prediction.throughput_samples_per_s


NEAR_BEST = 0.02
"""Plans whose predicted throughput is within this of the best's are called near ties: on the
emulated cluster (``layerplan validate``), plans this close traded places from one run to the
next — resnet_cifar's DDP and stanza at 4 workers and 100 Mbit/s measured 0.989-1.014 of each
other's step over eight full runs — while the model's median error per plan is 2-3%."""


def near_best(ranked: Sequence[Ranked], within: float = NEAR_BEST) -> list[int]:
    """Indices (into ``ranked``, best first) of the plans after the best whose throughput is within
    ``within`` of its: which one is faster is for a measurement to say."""
    if not ranked or ranked[0].throughput <= 0:
        return []
    best = ranked[0].throughput
    return [i for i in range(1, len(ranked)) if ranked[i].throughput >= best * (1 - within)]


class Ranking(list):
    """``Ranked`` plans, best first, and ``skipped``: "strategy config" → why it was left out."""

    def __init__(self, items=(), skipped: dict[str, str] | None = None) -> None:
        super().__init__(items)
        self.skipped: dict[str, str] = dict(skipped or {})


def config_text(config: Any) -> str:
    """'workers=7 servers=1' from a config dataclass or dict."""
    d = asdict(config) if is_dataclass(config) else dict(config)
    return " ".join(f"{k}={v}" for k, v in d.items() if k not in ("bucket_bytes",))


def config_key(strategy: str, config: Any) -> str:
    """'ps workers=7 servers=1': how a skipped config is named."""
    return f"{strategy} {config_text(config)}"


def candidates(net: NetSpec, cluster: ClusterSpec, batch: int, strategy: str,
               skipped: dict[str, str] | None = None) -> list[Any]:
    """The configs of ``strategy`` worth simulating. ``skipped``, when given, receives the Stanza
    node assignments left out because they do not fit in memory."""
    s = strategies.get(strategy)
    if s.applies(net):
        return []
    if strategy == "stanza":
        from layerplan.plan.assign import stanza_assignment
        from layerplan.strategies.stanza import StanzaConfig

        why: dict[int, str] = {}
        found = [a.config for a in stanza_assignment(net, cluster, batch, skipped=why)[:STANZA_FINALISTS]]
        if skipped is not None:
            for n_f, reason in why.items():
                skipped[config_key(strategy, StanzaConfig(conv_workers=cluster.nodes - n_f, fc_workers=n_f))] = reason
        return found
    return s.space(net, cluster, batch)


def rank(net: NetSpec, cluster: ClusterSpec, batch: int, names: Sequence[str] | None = None) -> Ranking:
    """Every applicable strategy × candidate config, best predicted throughput first. Configs the
    engine rejects (a role that does not fit in memory, other constraints) are left out and listed
    in the result's ``skipped``. Raises ConfigError, with the first reason, when there were
    candidates and every one was left out."""
    out = Ranking()
    for name in names or list(strategies.STRATEGIES):
        for config in candidates(net, cluster, batch, name, out.skipped):
            try:
                pred = strategies.predict(net, cluster, name, config, batch)
            except ConfigError as e:
                out.skipped[config_key(name, config)] = str(e)
                continue
            out.append(Ranked(strategy=name, config=config, prediction=pred))
    out.sort(key=lambda r: -r.throughput)
    if not out and out.skipped:
        key, why = next(iter(out.skipped.items()))
        more = len(out.skipped) - 1
        raise ConfigError(f"no config fits: {key}: {why}" + (f" (and {more} more skipped)" if more else ""))
    return out


def why_not(net: NetSpec, cluster: ClusterSpec, names: Sequence[str] | None = None,
            batch: int | None = None) -> dict[str, str]:
    """Strategies that do not apply, with the reason; given ``batch``, also every candidate config
    that cannot run ("strategy config" → why: memory or another constraint), found without
    simulating."""
    out = {}
    for name in names or list(strategies.STRATEGIES):
        reason = strategies.get(name).applies(net)
        if reason:
            out[name] = reason
        elif name in ("stanza", "ralp") and cluster.nodes < 2:
            out[name] = f"{name} needs at least 2 nodes"
        elif batch is not None:
            for config in candidates(net, cluster, batch, name, out):
                try:
                    problem = strategies.memory_problem(net, cluster, name, config, batch)
                except ConfigError as e:
                    problem = str(e)
                if problem:
                    out[config_key(name, config)] = problem
    return out


# ---- the plan file ---------------------------------------------------------------------------
PLAN_FORMAT = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """What `layerplan plan -o` writes and `layerplan train --plan` executes."""

    model: str
    """MODEL as given on the command line (zoo name, factory path or NetSpec file)."""
    input_size: int | None
    num_classes: int | None
    batch_size: int
    """Samples per worker per step."""
    strategy: str
    config: dict[str, Any]
    cluster: dict[str, Any]
    """The ClusterSpec the prediction is for (ClusterSpec.to_dict)."""
    predicted: dict[str, Any] = field(default_factory=dict)
    """The engine's Prediction.to_dict() for this plan."""

    def to_dict(self) -> dict[str, Any]:
        return {"format": PLAN_FORMAT, "model": self.model, "input_size": self.input_size, "num_classes": self.num_classes,
                "batch_size": self.batch_size, "strategy": self.strategy, "config": self.config, "cluster": self.cluster,
                "predicted": self.predicted}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except OSError as e:
            raise SpecError(f"cannot read plan file {str(p)!r}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise SpecError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(data, dict):
            raise SpecError(f"{p}: a plan file holds a JSON object")
        keys = {"format", "model", "input_size", "num_classes", "batch_size", "strategy", "config", "cluster", "predicted"}
        unknown, missing = sorted(set(data) - keys), sorted(keys - set(data))
        if unknown:
            raise SpecError(f"{p}: unknown key(s) {', '.join(unknown)}")
        if missing:
            raise SpecError(f"{p}: missing key(s) {', '.join(missing)}")
        if data["format"] != PLAN_FORMAT:
            raise SpecError(f"{p}: plan format {data['format']!r} is not supported")
        plan = cls(**{k: v for k, v in data.items() if k != "format"})
        s = strategies.get(plan.strategy)
        s.config_from_dict(plan.config)  # strict: unknown config keys are errors
        return plan

    def cluster_spec(self) -> ClusterSpec:
        try:
            return cluster_from_dict(self.cluster, "plan cluster")
        except LayerplanError:
            raise
        except Exception as e:  # a hand-edited file with wrong types
            raise SpecError(f"plan cluster: {e}") from None

    def strategy_config(self) -> Any:
        return strategies.get(self.strategy).config_from_dict(self.config)


def make_plan(model: str, input_size: int | None, num_classes: int | None, batch: int, cluster: ClusterSpec,
              ranked: Ranked) -> Plan:
    s = strategies.get(ranked.strategy)
    return Plan(model=model, input_size=input_size, num_classes=num_classes, batch_size=batch, strategy=ranked.strategy,
                config=s.config_to_dict(ranked.config), cluster=cluster.to_dict(), predicted=ranked.prediction.to_dict())
