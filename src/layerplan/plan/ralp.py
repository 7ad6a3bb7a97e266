"""RALP's profiler: is a network worth splitting, and where (SYSTEMS.md §5).

Step 1, skewness (RALP eq.1): the third standardized moment of where the parameters sit. We read
it, as the paper's signs require, as the skewness of the layer-position distribution weighted by
parameter mass: positions i = 1..N over the weighted layers (conv and fc, in forward order), weight
P_i / ΣP. Negative S: the mass sits in the later layers (the FC tail of AlexNet or VGG).

Step 2, eligibility: RALP applies only if S < K (default K = −0.5, "at least moderate skewness";
K = −1.5 is "very selective").

Step 3, split point: argmin_i (O_i + Σ_{x≤i} P_x) over the layers — the activations that cross
the split plus the head's parameters that still need aggregation — never between two
compute-heavy (conv) layers.

Decision where the paper is silent: when the unrestricted argmin falls between two conv layers it
is vetoed, and the split becomes the cheapest allowed cut, which always lies after the last conv
layer (a cut before the first conv would leave the workers nothing to compute). The profile
reports the vetoed argmin so the user sees it. Only single-tensor cuts of the DAG are candidates.
A network with no allowed cut (no layer after its last conv, or no conv at all) is not eligible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from layerplan.netspec.spec import NetSpec, single_cut

DEFAULT_THRESHOLD = -0.5  # RALP step 2: "at least moderate skewness"


@dataclass(frozen=True, kw_only=True, slots=True)
class RalpProfile:
    """What RALP's profiler concludes for one network at one batch size."""

    skewness: float
    """RALP eq.1: skewness of the parameter-mass position distribution (negative = mass late)."""
    threshold: float
    """K: RALP applies when skewness < K."""
    eligible: bool
    """skewness < threshold and an allowed split exists."""
    split_after: str | None
    """Last layer of the workers' head; the PS worker runs the rest."""
    split_cost_bytes: float
    """O_i·batch + Σ_{x≤i} P_x at the split (bytes)."""
    split_activation_bytes: float
    """O_i·batch: activations that cross the split per worker step (bytes)."""
    head_param_bytes: float
    """Σ_{x≤i} P_x: the head's parameters that still go through aggregation (bytes)."""
    vetoed_split: str | None
    """The unrestricted argmin when it fell between two conv layers (then moved), else None."""
    batch: int
    reason: str
    """One line a person can read: why eligible or not."""

    def to_dict(self) -> dict:
        return {
            "skewness": self.skewness,
            "threshold": self.threshold,
            "eligible": self.eligible,
            "split_after": self.split_after,
            "split_cost_bytes": self.split_cost_bytes,
            "split_activation_bytes": self.split_activation_bytes,
            "head_param_bytes": self.head_param_bytes,
            "vetoed_split": self.vetoed_split,
            "batch": self.batch,
            "reason": self.reason,
        }


def parameter_skewness(net: NetSpec) -> float:
    """RALP eq.1 (read as above): weighted skewness of weighted-layer positions."""
    masses = [layer.params for layer in net.layers if layer.kind in ("conv", "fc") and layer.params > 0]
    total = float(sum(masses))
    if len(masses) < 2 or total == 0:
        return 0.0
    w = [m / total for m in masses]
    pos = range(1, len(masses) + 1)
    mean = sum(wi * i for wi, i in zip(w, pos))
    var = sum(wi * (i - mean) ** 2 for wi, i in zip(w, pos))
    if var <= 0:
        return 0.0
    third = sum(wi * (i - mean) ** 3 for wi, i in zip(w, pos))
    return third / math.pow(var, 1.5)


def split_costs(net: NetSpec, batch: int) -> list[tuple[int, float]]:
    """(layer index, O_i·batch + Σ_{x≤i} P_x) for every single-tensor cut with a non-empty tail
    and at least one conv in the head (RALP step 3 candidates before the conv–conv veto)."""
    first_conv = next((i for i, layer in enumerate(net.layers) if layer.kind == "conv"), None)
    if first_conv is None:
        return []
    out = []
    head_params = 0
    for i, layer in enumerate(net.layers):
        head_params += layer.param_bytes
        if i < first_conv or i == len(net.layers) - 1:
            continue
        if not net.cut_is_single(i):
            continue
        out.append((i, layer.out_bytes * batch + head_params))  # RALP step 3
    return out


def between_convs(net: NetSpec, i: int) -> bool:
    """True when a conv layer lies at or before i and another after i (RALP's veto)."""
    before = any(layer.kind == "conv" for layer in net.layers[: i + 1])
    after = any(layer.kind == "conv" for layer in net.layers[i + 1 :])
    return before and after


def profile(net: NetSpec, batch: int = 32, threshold: float = DEFAULT_THRESHOLD) -> RalpProfile:
    """RALP steps 1–3 for ``net`` at ``batch`` samples per worker."""
    skew = parameter_skewness(net)
    costs = split_costs(net, batch)
    vetoed = None
    best = None
    if costs:
        arg, _ = min(costs, key=lambda c: (c[1], c[0]))
        allowed = [c for c in costs if not between_convs(net, c[0])]
        if between_convs(net, arg):
            vetoed = net.layers[arg].name
        if allowed:
            best = min(allowed, key=lambda c: (c[1], c[0]))
    if best is None:
        return RalpProfile(skewness=skew, threshold=threshold, eligible=False, split_after=None, split_cost_bytes=0.0,
                           split_activation_bytes=0.0, head_param_bytes=0.0, vetoed_split=vetoed, batch=batch,
                           reason="no split after the conv layers (no FC tail)")
    i, cost = best
    act = float(net.layers[i].out_bytes * batch)
    eligible = skew < threshold
    if eligible:
        reason = f"skewness {skew:.2f} < K = {threshold:g}: parameters sit in the tail"
    else:
        reason = f"skewness {skew:.2f} ≥ K = {threshold:g}: parameters are not concentrated in the tail"
    return RalpProfile(skewness=skew, threshold=threshold, eligible=eligible, split_after=net.layers[i].name,
                       split_cost_bytes=float(cost), split_activation_bytes=act, head_param_bytes=float(cost) - act,
                       vetoed_split=vetoed, batch=batch, reason=reason)
