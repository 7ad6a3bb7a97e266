"""What a person reads: rich tables, and the JSON objects scripts read. No computation here."""

from __future__ import annotations

from typing import Any, Mapping

from rich.console import Console
from rich.table import Table

from layerplan import units
from layerplan.netspec.spec import NetSpec
from layerplan.plan.ralp import RalpProfile

_CONSOLE: Console | None = None


def console() -> Console:
    global _CONSOLE
    if _CONSOLE is None:
        import sys

        # a pipe or a file gets wide lines rather than rich's 80-column default
        _CONSOLE = Console(highlight=False, width=None if sys.stdout.isatty() else 150)
    return _CONSOLE


def pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "–"


# ---- profile ---------------------------------------------------------------------------------
def profile_dict(net: NetSpec, prof: RalpProfile) -> dict[str, Any]:
    """`profile --json`: totals, the conv/FC split, per-layer rows and the RALP profile."""
    conv_flops = sum(layer.fwd_flops for layer in net.conv_layers)
    return {
        "model": net.name,
        "input_shape": list(net.input_shape),
        "dtype_bytes": net.dtype_bytes,
        "num_classes": net.num_classes,
        "total_params": net.total_params,
        "param_bytes": net.param_bytes,
        "conv_params": net.conv_params,
        "fc_params": net.fc_params,
        "fwd_flops_per_sample": net.fwd_flops,
        "bwd_flops_per_sample": net.bwd_flops,
        "conv_fwd_flops_per_sample": conv_flops,
        "fc_fwd_flops_per_sample": net.fwd_flops - conv_flops,
        "activation_bytes_per_sample": sum(layer.out_bytes for layer in net.layers),
        "boundary": net.boundary,
        "boundary_bytes_per_sample": net.boundary_bytes,
        "layers": [
            {
                "name": layer.name,
                "kind": layer.kind,
                "op": layer.op,
                "parents": list(layer.parents),
                "out_shape": list(layer.out_shape),
                "params": layer.params,
                "fwd_flops": layer.fwd_flops,
                "bwd_flops": layer.bwd_flops,
                "bwd_input_flops": layer.bwd_input_flops,
                "bwd_weight_flops": layer.bwd_weight_flops,
                "out_bytes": layer.out_bytes,
            }
            for layer in net.layers
        ],
        "ralp": prof.to_dict(),
    }


def print_profile(net: NetSpec, prof: RalpProfile, show_all: bool = True) -> None:
    c = console()
    shape = "×".join(map(str, net.input_shape))
    t = Table(title=f"{net.name}: input {shape}, per sample", title_justify="left")
    for col, just in [("#", "right"), ("layer", "left"), ("kind", "left"), ("op", "left"), ("output", "left"),
                      ("params", "right"), ("fwd FLOP", "right"), ("bwd FLOP", "right"), ("out bytes", "right")]:
        t.add_column(col, justify=just)
    for i, layer in enumerate(net.layers):
        if not show_all and layer.params == 0 and layer.name != net.boundary:
            continue
        style = "bold cyan" if layer.name == net.boundary else None
        t.add_row(str(i), layer.name + ("  ◀ boundary" if layer.name == net.boundary else ""), layer.kind, layer.op,
                  "×".join(map(str, layer.out_shape)) or "scalar", f"{layer.params:,}" if layer.params else "",
                  units.format_flops(layer.fwd_flops, 3) if layer.fwd_flops else "",
                  units.format_flops(layer.bwd_flops, 3) if layer.bwd_flops else "",
                  units.format_bytes(layer.out_bytes, digits=3), style=style)
    c.print(t)

    conv_flops = sum(layer.fwd_flops for layer in net.conv_layers)
    fc_flops = net.fwd_flops - conv_flops
    s = Table(title="totals", title_justify="left", show_header=True)
    for col in ("", "params", "param bytes", "fwd FLOP/sample", "bwd FLOP/sample"):
        s.add_column(col, justify="right" if col else "left")
    s.add_row("network", f"{net.total_params:,}", units.format_bytes(net.param_bytes),
              units.format_flops(net.fwd_flops), units.format_flops(net.bwd_flops))
    if net.boundary is not None:
        conv_bwd = sum(layer.bwd_flops for layer in net.conv_layers)
        s.add_row(f"conv phase (≤ {net.boundary})", f"{net.conv_params:,} ({pct(net.conv_params, net.total_params)})",
                  units.format_bytes(net.conv_param_bytes), f"{units.format_flops(conv_flops)} ({pct(conv_flops, net.fwd_flops)})",
                  units.format_flops(conv_bwd))
        s.add_row("FC phase", f"{net.fc_params:,} ({pct(net.fc_params, net.total_params)})",
                  units.format_bytes(net.fc_param_bytes), f"{units.format_flops(fc_flops)} ({pct(fc_flops, net.fwd_flops)})",
                  units.format_flops(net.bwd_flops - conv_bwd))
    c.print(s)
    if net.boundary is None:
        c.print("phase boundary: none (no FC layers after the last conv): stanza, ralp and groups do not apply")
    else:
        c.print(f"phase boundary: after [bold]{net.boundary}[/], {units.format_bytes(net.boundary_bytes)} of activations "
                "per sample cross it")
    verdict = "[green]eligible[/]" if prof.eligible else "[yellow]not eligible[/]"
    c.print(f"RALP (batch {prof.batch}): skewness {prof.skewness:.3f}, K = {prof.threshold:g} → {verdict} ({prof.reason})")
    if prof.split_after:
        c.print(f"  split after [bold]{prof.split_after}[/]: {units.format_bytes(prof.split_activation_bytes)} activations "
                f"+ {units.format_bytes(prof.head_param_bytes)} head parameters = {units.format_bytes(prof.split_cost_bytes)} per worker")
    if prof.vetoed_split:
        c.print(f"  (the unrestricted argmin, after {prof.vetoed_split}, lies between two conv layers: vetoed)")


# ---- listings --------------------------------------------------------------------------------
def print_zoo(zoo: Mapping[str, Any]) -> None:
    t = Table(title="model zoo (use the name as MODEL; --input-size and --num-classes override)", title_justify="left")
    t.add_column("name")
    t.add_column("input", justify="right")
    t.add_column("classes", justify="right")
    t.add_column("source")
    for e in zoo.values():
        t.add_row(e.name, f"{e.in_channels}×{e.default_input_size}×{e.default_input_size}", str(e.default_num_classes), e.source)
    console().print(t)


def print_hardware() -> None:
    from layerplan import hardware

    t = Table(title="devices (--device)", title_justify="left")
    for col in ("name", "peak fp32", "memory bw", "memory", "efficiency", "source"):
        t.add_column(col)
    for d in [*hardware.DEVICES.values(), *filter(None, [hardware.this_cpu()])]:
        t.add_row(d.name, units.format_flops_rate(d.peak_flops_per_s), units.format_bytes(d.mem_bandwidth_bytes_per_s) + "/s",
                  units.format_bytes(d.memory_bytes, binary=True), f"{d.compute_efficiency:.2f}", d.note)
    console().print(t)
    t = Table(title="links (--bandwidth)", title_justify="left")
    for col in ("name", "rate", "latency", "efficiency", "note"):
        t.add_column(col)
    for link in hardware.LINKS.values():
        t.add_row(link.name, units.format_bandwidth(link.bandwidth_bytes_per_s), units.format_seconds(link.latency_s),
                  f"{link.efficiency:.3f}", link.note)
    console().print(t)
    t = Table(title="node presets (--cluster PRESET --nodes N)", title_justify="left")
    for col in ("name", "device", "per node", "nic", "note"):
        t.add_column(col)
    for name, (dev, n, nic, note) in hardware.NODES.items():
        t.add_row(name, dev, str(n), nic, note)
    console().print(t)


def print_cluster(c) -> None:
    t = Table(title=f"cluster {c.name}: {c.describe()}", title_justify="left", show_header=False)
    t.add_column("")
    t.add_column("")
    d, n = c.device, c.nic
    t.add_row("nodes × devices", f"{c.nodes} × {c.devices_per_node}")
    t.add_row("device", f"{d.name}: {units.format_flops_rate(d.peak_flops_per_s)} peak × {d.compute_efficiency:.2f} = "
                        f"{units.format_flops_rate(d.achieved_flops_per_s)}, {units.format_bytes(d.memory_bytes, binary=True)}, "
                        f"{units.format_bytes(d.mem_bandwidth_bytes_per_s)}/s")
    t.add_row("NIC", f"{n.name}: {units.format_bandwidth(n.bandwidth_bytes_per_s)} × {n.efficiency:.3f} = "
                     f"{units.format_bandwidth(n.payload_bytes_per_s)} payload, latency {units.format_seconds(n.latency_s)}"
                     + ("" if n.duplex_efficiency == 1.0 else f"; each direction {n.duplex_efficiency:.3f} of it with both busy")
                     + ("" if not n.flow_lead_bytes else
                        f"; of flows leaving a NIC together the first leads by √({units.format_bytes(n.flow_lead_bytes)}·S)"))
    t.add_row("switch", "non-blocking" if c.switch_bandwidth_bytes_per_s is None else units.format_bandwidth(c.switch_bandwidth_bytes_per_s))
    t.add_row("shared cores", "no (each node its own)" if c.shared_cores is None else
              f"all nodes share {c.shared_cores}" + ("" if c.shared_core_capacity is None else
                                                     f" ({c.shared_core_capacity:.2f} cores' worth with all busy)")
              + ("" if c.oversubscribed_core_capacity is None else
                 f"; {c.oversubscribed_core_capacity:.2f} with more compute threads than cores")
              + ("" if not c.oversubscribed_wait_s else
                 f"; with more ranks than cores each ring round or message waits "
                 f"{units.format_seconds(c.oversubscribed_wait_s)} more")
              + ("" if not c.oversubscribed_message_cpu_s else
                 f"; each end of a message costs {units.format_seconds(c.oversubscribed_message_cpu_s)} of CPU")
              + ("" if not c.collective_wait_s else
                 f"; each collective call adds {units.format_seconds(c.collective_wait_s)} to a step")
              + ("" if c.collective_busy_cpu_s_per_byte is None else
                 f"; a collective's bytes beside its ranks' compute take {1e9 * c.collective_busy_cpu_s_per_byte:.1f} ns "
                 "of CPU each")
              + ("" if c.collective_core_share is None else
                 f"; a collective's thread keeps at most {c.collective_core_share:.2f} of a core a rank busy"))
    console().print(t)


# ---- predictions and plans -------------------------------------------------------------------
def config_text(config: Any) -> str:
    """'workers=7 servers=1' from a config dataclass or dict."""
    from layerplan.plan.planner import config_text as text

    return text(config)


def prediction_dict(net: NetSpec, cluster, strategy: str, config: dict, batch: int, pred) -> dict[str, Any]:
    """`predict --json`: the engine's Prediction with what it is a prediction of."""
    d = pred.to_dict()
    d.update({"model": net.name, "strategy": strategy, "config": config, "batch_size": batch,
              "global_batch": pred.samples_per_step, "cluster": cluster.to_dict()})
    return d


def print_prediction(doc: dict[str, Any], pred) -> None:
    c = console()
    c.print(f"[bold]{doc['model']}[/] · {doc['strategy']} ({config_text(doc['config'])}) · "
            f"{doc['batch_size']} samples/worker, global batch {doc['global_batch']}")
    c.print(f"step time {units.format_seconds(pred.step_time_s)} · throughput "
            f"{pred.throughput_samples_per_s:,.1f} samples/s · bottleneck: {pred.bottleneck}")
    memory = getattr(pred, "memory_bytes_per_role", {})
    cap = getattr(pred, "device_memory_bytes", 0.0)
    t = Table(title="per role (one node of each)", title_justify="left")
    cols = ["role", "nodes", "compute", "communication", "sent/step", "received/step"]
    if memory:
        cols.append(f"memory (of {units.format_bytes(cap, binary=True, digits=3)})" if cap else "memory")
    for col in cols:
        t.add_column(col, justify="left" if col == "role" else "right")
    for role, b in pred.breakdown.items():
        row = [role, str(pred.groups[role]), units.format_seconds(b["compute_s"]), units.format_seconds(b["comm_s"]),
               units.format_bytes(pred.bytes_sent_per_node.get(role, 0)),
               units.format_bytes(pred.bytes_received_per_node.get(role, 0))]
        if memory:
            row.append(units.format_bytes(memory.get(role, 0), binary=True, digits=3))
        t.add_row(*row)
    c.print(t)
    c.print(f"bytes on the network per step: {units.format_bytes(pred.total_bytes)}")


def _speedup(r, ref) -> str:
    return f"{r.throughput / ref.throughput:.2f}×" if ref else "–"


def plan_rows(ranked, top: int):
    best_ps = next((r for r in ranked if r.strategy == "ps"), None)
    ring = next((r for r in ranked if r.strategy == "allreduce" and getattr(r.config, "algorithm", "") == "ring"), None)
    return best_ps, ring, ranked[:top]


def plan_dict(net: NetSpec, cluster, batch: int, ranked, skipped: dict[str, str], top: int) -> dict[str, Any]:
    from layerplan.plan.planner import near_best

    best_ps, ring, rows = plan_rows(ranked, top)
    return {
        "model": net.name, "cluster": cluster.to_dict(), "batch_size": batch,
        "ranked": [{"rank": i + 1, "strategy": r.strategy, "config": config_text(r.config),
                    "step_time_s": r.prediction.step_time_s, "throughput_samples_per_s": r.throughput,
                    "global_batch": r.prediction.samples_per_step,
                    "speedup_vs_ps": r.throughput / best_ps.throughput if best_ps else None,
                    "speedup_vs_ring_allreduce": r.throughput / ring.throughput if ring else None,
                    "bottleneck": r.prediction.bottleneck, **_hybrid_layers(net, r, batch)}
                   for i, r in enumerate(rows)],
        "not_applicable": skipped,
        "skipped": dict(getattr(ranked, "skipped", {})),
        # ranks (1-based) within NEAR_BEST of the best's throughput: a near tie, for a measurement to call
        "near_best": [i + 1 for i in near_best(ranked)],
    }


def _hybrid_layers(net: NetSpec, ranked, batch: int) -> dict[str, Any]:
    """{"layers": [...]} for a hybrid row: each fc layer partitioned or replicated, and why."""
    if ranked.strategy != "hybrid":
        return {}
    from layerplan.strategies.hybrid import layer_choices

    return {"layers": [c.to_dict() for c in layer_choices(net, ranked.config, batch)]}


def print_plan(net: NetSpec, cluster, batch: int, ranked, skipped: dict[str, str], top: int) -> None:
    from layerplan.plan.planner import NEAR_BEST, near_best

    best_ps, ring, rows = plan_rows(ranked, top)
    t = Table(title=f"{net.name} on {cluster.describe()}, {batch} samples/worker: {len(ranked)} plans ranked",
              title_justify="left")
    for col in ("#", "strategy", "config", "step time", "samples/s", "vs best ps", "vs ring", "bottleneck"):
        t.add_column(col, justify="right" if col in ("#", "step time", "samples/s", "vs best ps", "vs ring") else "left")
    for i, r in enumerate(rows):
        t.add_row(str(i + 1), r.strategy, config_text(r.config), units.format_seconds(r.prediction.step_time_s),
                  f"{r.throughput:,.1f}", _speedup(r, best_ps), _speedup(r, ring), r.prediction.bottleneck,
                  style="bold green" if i == 0 else None)
    console().print(t)
    close = near_best(ranked)
    if close:
        console().print(f"{'#' + ', #'.join(str(i + 1) for i in close[:5])}{' and more' if len(close) > 5 else ''} "
                        f"within {100 * NEAR_BEST:.0f}% of #1's throughput: a near tie — plans this close trade places "
                        "from run to run; run them (layerplan train) to choose", markup=False, soft_wrap=True)
    hybrids = [(i, r) for i, r in enumerate(rows) if r.strategy == "hybrid"]
    # the best hybrid row, and the best one with several FC machines (where the choice matters)
    shown = hybrids[:1] + [h for h in hybrids if h[1].config.fc_workers > 1][:1]
    for i, r in dict(shown).items():
        console().print(f"hybrid #{i + 1} ({config_text(r.config)}), per fc layer (Yan §6.4: partitioning moves "
                        "activations, replicating moves weights):", markup=False, soft_wrap=True)
        for row in _hybrid_layers(net, r, batch)["layers"]:
            console().print(f"  {row['layer']}: {row['reason']}", markup=False, soft_wrap=True)
    for name, why in skipped.items():
        console().print(f"  {name}: not applicable — {why}", markup=False, soft_wrap=True)
    for line in skipped_lines(getattr(ranked, "skipped", {})):
        console().print(line, markup=False, soft_wrap=True)


def skipped_lines(skipped: Mapping[str, str]) -> list[str]:
    """One line per strategy with configs left out: how many, and the first one's reason."""
    by_strategy: dict[str, list[tuple[str, str]]] = {}
    for key, why in skipped.items():
        strategy, _, config = key.partition(" ")
        by_strategy.setdefault(strategy, []).append((config, why))
    out = []
    for strategy, rows in by_strategy.items():
        config, why = rows[0]
        why = why.removeprefix(f"{strategy}: ")
        n = len(rows)
        what = f"{n} configs skipped, e.g. {config}" if n > 1 else f"{config} skipped"
        out.append(f"  {strategy}: {what} — {why}")
    return out


def print_scaling(curves, strong: bool) -> None:
    for cv in curves:
        t = Table(title=f"{cv.strategy}: {'strong' if strong else 'weak'} scaling", title_justify="left")
        for col in ("workers", "nodes", "batch/worker", "step time", "samples/s", "speedup", "bottleneck"):
            t.add_column(col, justify="left" if col == "bottleneck" else "right")
        for p in cv.points:
            t.add_row(str(p.workers), str(p.nodes), str(p.batch_per_worker), units.format_seconds(p.step_time_s),
                      f"{p.throughput_samples_per_s:,.1f}", f"{p.speedup:.2f}×", p.bottleneck)
        console().print(t)
        for s in cv.skipped:
            console().print(f"  skipped {s}")
