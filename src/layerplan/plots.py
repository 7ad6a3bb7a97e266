"""Matplotlib figures a person wants to look at: labelled axes with units, a legend, a title that
names the model (and cluster and batch where they matter). Always the Agg backend (no display)."""

from __future__ import annotations

from pathlib import Path

from layerplan.netspec.spec import NetSpec


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> None:
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p, dpi=130)


def profile_plot(net: NetSpec, path: str | Path) -> None:
    """Cumulative parameters and FLOPs (share of the total) over the layers, the boundary marked."""
    plt = _pyplot()
    params = [layer.params for layer in net.layers]
    flops = [layer.fwd_flops + layer.bwd_flops for layer in net.layers]
    cum_p, cum_f, tp, tf = [], [], 0, 0
    for p, f in zip(params, flops):
        tp += p
        tf += f
        cum_p.append(tp)
        cum_f.append(tf)
    x = list(range(len(net.layers)))
    fig, ax = plt.subplots(figsize=(9, 4.8))
    ax.plot(x, [100.0 * v / max(tp, 1) for v in cum_p], label=f"parameters ({tp / 1e6:.2f} M in all)", color="tab:blue")
    ax.plot(x, [100.0 * v / max(tf, 1) for v in cum_f], label=f"FLOPs, fwd+bwd ({tf / 1e9:.3g} GFLOP/sample in all)",
            color="tab:orange")
    if net.boundary is not None:
        b = net.boundary_index
        ax.axvline(b, color="grey", linestyle="--", label=f"phase boundary (after {net.boundary})")
    ax.set_xlabel("layer index (topological order)")
    ax.set_ylabel("cumulative share of the network (%)")
    ax.set_ylim(0, 102)
    ax.set_title(f"{net.name}: where parameters and compute sit (input {'×'.join(map(str, net.input_shape))})")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    _save(fig, path)
    plt.close(fig)


TIMELINE_STEPS = 8
"""The timeline draws at most this many of the last steps the engine measured (a schedule drawn
with a run's spread, ``StepGraph.spread``, unrolls dozens)."""


def timeline_entries(pred) -> list:
    """The timeline's entries ``timeline_plot`` draws: all, or where the engine unrolled more than
    TIMELINE_STEPS iterations, those within the last TIMELINE_STEPS steps of its measured window."""
    if pred.iterations <= TIMELINE_STEPS:
        return list(pred.timeline)
    hi = pred.window_s[1]
    lo = hi - TIMELINE_STEPS * pred.step_time_s
    return [e for e in pred.timeline if e.end_s > lo and e.start_s < hi]


def timeline_plot(pred, path: str | Path, title: str) -> None:
    """One row per role: its compute and communication tasks over the predicted steps (at most the
    last TIMELINE_STEPS the engine measured)."""
    plt = _pyplot()
    roles = list(pred.groups)
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.9 * len(roles)))
    colors = {"compute": "tab:blue", "comm": "tab:orange"}
    seen = set()
    texts: dict[tuple[int, float], list[tuple[float, float]]] = {}  # row → labelled spans (merged groups overlap)
    entries = timeline_entries(pred)
    clipped = len(entries) < len(pred.timeline)
    t0 = min((e.start_s for e in entries), default=0.0) if clipped else 0.0  # the drawn steps from 0
    labelled = 0.06 * (max((e.end_s for e in entries), default=t0) - t0 if clipped else pred.step_time_s)
    for e in entries:
        y = roles.index(e.group)
        kind = e.tag if e.tag in colors else "comm"
        label = None if kind in seen else ("compute" if kind == "compute" else "communication")
        seen.add(kind)
        off = 0.2 if kind == "comm" else -0.2
        ax.barh(y + off, (e.end_s - e.start_s) * 1e3, left=(e.start_s - t0) * 1e3, height=0.35, color=colors[kind],
                edgecolor="black", linewidth=0.4, label=label)
        spans = texts.setdefault((y, off), [])
        if (e.end_s - e.start_s) > max(labelled, 1e-12) and not any(
                a < e.end_s and e.start_s < b for a, b in spans):
            spans.append((e.start_s, e.end_s))
            ax.text((e.start_s + e.end_s) / 2 * 1e3 - t0 * 1e3, y + off, e.name.split("@")[0], ha="center",
                    va="center", fontsize=7)
    ax.set_yticks(range(len(roles)), [f"{r} (×{pred.groups[r]})" for r in roles])
    ax.set_xlabel(f"time over the last {TIMELINE_STEPS} predicted steps (ms)" if clipped else "time within the step (ms)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    _save(fig, path)
    plt.close(fig)


def scaling_plot(curves, path: str | Path, title: str) -> None:
    """Throughput and speedup against workers, one line per strategy."""
    plt = _pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for cv in curves:
        w = [p.workers for p in cv.points]
        a1.plot(w, [p.throughput_samples_per_s for p in cv.points], marker="o", label=cv.strategy)
        a2.plot(w, [p.speedup for p in cv.points], marker="o", label=cv.strategy)
    allw = sorted({p.workers for cv in curves for p in cv.points})
    if allw:
        a2.plot(allw, allw, linestyle=":", color="grey", label="linear")
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_xlabel("workers")
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    a1.set_ylabel("throughput (samples/s)")
    a2.set_ylabel("speedup over one device (×)")
    fig.suptitle(title, fontsize=10)
    _save(fig, path)
    plt.close(fig)
