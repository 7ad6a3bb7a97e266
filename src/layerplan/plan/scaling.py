"""PALEO-style scaling studies (PALEO §4): throughput and speedup against the number of workers.

Weak scaling keeps the batch per worker; strong scaling splits a fixed global batch over the
workers. Speedup is against one device training alone on the same global batch (no
communication), as PALEO reports it. Each point gets a cluster of exactly the nodes it needs
(workers plus servers or FC workers)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from layerplan import strategies
from layerplan.errors import ConfigError
from layerplan.hardware import ClusterSpec
from layerplan.netspec.spec import NetSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Point:
    workers: int
    nodes: int
    batch_per_worker: int
    step_time_s: float
    throughput_samples_per_s: float
    speedup: float
    bottleneck: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Curve:
    strategy: str
    points: tuple[Point, ...]
    skipped: tuple[str, ...]
    """Worker counts left out, with the reason."""


def _config(name: str, net: NetSpec, cluster: ClusterSpec, w: int, batch: int, options: dict[str, Any]):
    s = strategies.get(name)
    if name == "ps":
        servers = options.get("servers") or 1
        return replace(cluster, nodes=w + servers), s.Config(workers=w, servers=servers)
    if name == "allreduce":
        return replace(cluster, nodes=w), s.Config(workers=w, algorithm=options.get("algorithm") or "ring")
    if name == "stanza":
        n_f = min(options.get("fc_workers") or 1, w)
        return replace(cluster, nodes=w + n_f), s.Config(conv_workers=w, fc_workers=n_f)
    if name == "ralp":
        c = replace(cluster, nodes=w + 1)
        cfg = s.default(net, c, batch, workers=w)
        return c, cfg
    if name == "hybrid":  # w CONV workers and n_f FC machines the fc layers are partitioned over
        n_f = options.get("fc_workers") or 1
        c = replace(cluster, nodes=w + n_f)
        return c, s.default(net, c, batch, conv_workers=w, fc_workers=n_f)
    if name == "groups":  # w conv machines, the merged FC server and the conv model server
        c = replace(cluster, nodes=w + 2)
        return c, s.default(net, c, batch, machines=w)
    c = replace(cluster, nodes=w)
    return c, s.default(net, c, batch, workers=w)


def curves(net: NetSpec, cluster: ClusterSpec, names: Sequence[str], workers: Sequence[int], batch: int, *,
           strong: bool = False, options: dict[str, Any] | None = None) -> list[Curve]:
    options = options or {}
    for n in names:
        strategies.get(n).require_applies(net)
    out = []
    for name in names:
        pts, skipped = [], []
        for w in workers:
            b = batch // w if strong else batch
            if b < 1:
                skipped.append(f"{w} workers: a global batch of {batch} gives less than one sample per worker")
                continue
            try:
                c, cfg = _config(name, net, cluster, w, b, options)
                pred = strategies.predict(net, c, name, cfg, b)
                single = strategies.predict(net, replace(cluster, nodes=1), "allreduce",
                                            strategies.get("allreduce").Config(workers=1), b * w,
                                            check_memory=False)  # the reference: one device's speed, as if it fit
            except ConfigError as e:
                skipped.append(f"{w} workers: {e}")
                continue
            pts.append(Point(workers=w, nodes=c.nodes, batch_per_worker=b, step_time_s=pred.step_time_s,
                             throughput_samples_per_s=pred.throughput_samples_per_s,
                             speedup=pred.throughput_samples_per_s / single.throughput_samples_per_s,
                             bottleneck=pred.bottleneck))
        out.append(Curve(strategy=name, points=tuple(pts), skipped=tuple(skipped)))
    return out


def to_dict(cs: Sequence[Curve]) -> dict[str, Any]:
    return {c.strategy: {"points": [{"workers": p.workers, "nodes": p.nodes, "batch_per_worker": p.batch_per_worker,
                                     "step_time_s": p.step_time_s, "throughput_samples_per_s": p.throughput_samples_per_s,
                                     "speedup": p.speedup, "bottleneck": p.bottleneck} for p in c.points],
                         "skipped": list(c.skipped)} for c in cs}
