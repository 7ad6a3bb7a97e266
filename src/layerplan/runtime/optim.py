"""The SGD every rank, the single-process reference and the calibration's benchmarks step with:
torch.optim.SGD (momentum, weight decay; no dampening, no Nesterov) on torch's fused kernel where
it has one for the parameters' device and dtype (CPU and CUDA floats), its per-tensor loop
elsewhere.

The fused kernel reads the gradient, parameters and momentum once and writes parameters and
momentum once — the five passes over the parameter bytes the cost model charges an update
(``strategies.base.update_s``) — and gives the same numbers bit for bit as the loop (float32 and
float64, weight decay included: ``tests/test_optim.py``). The loop takes more passes: measured on
the 2-core Xeon VM of the README's validation runs, one thread, each model's parameters, loop
against fused: alexnet_cifar (115 MB) 39.5 against 24.7 ms, vgg16_cifar (135 MB) 46.4 against
29.6 ms, resnet_cifar (1.1 MB) 0.73 against 0.30 ms. The merged FC server of Omnivore's groups takes one update of the FC model
per group batch, a parameter server one of its shard per step: both wait for it.

The calibration times its update bandwidth (``calibrate._flat_update_s``) with the same
optimizer, so the cost model's update describes the runs'.
"""

from __future__ import annotations

FUSED_DEVICES = ("cpu", "cuda")
"""Where the runs step with the fused kernel (torch has it for floating-point dense tensors there)."""


def sgd(params, *, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
    """torch.optim.SGD over ``params``, fused where torch supports it for them."""
    import torch

    params = list(params)
    fused = all(p.device.type in FUSED_DEVICES and p.dtype.is_floating_point and not p.is_sparse for p in params)
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=fused or None)


def load_state(opt, state: dict, **hyper) -> None:
    """Restore ``opt``'s state (the momentum buffers) from ``state``, keeping ``opt``'s own kernel
    (fused or not: a checkpoint may come from a run that had the other) and setting ``hyper``
    (e.g. this run's lr, momentum, weight decay) on every parameter group: torch's
    ``load_state_dict`` would bring back the saved ones."""
    fused = [g.get("fused") for g in opt.param_groups]
    opt.load_state_dict(state)
    for group, f in zip(opt.param_groups, fused):
        group.update(fused=f, **hyper)
