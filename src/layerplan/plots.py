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
