"""runtime.optim: the fused SGD every rank steps with is torch's SGD, number for number, and a
checkpoint's momentum comes back without the saved kernel or hyperparameters."""

from __future__ import annotations

import pytest
import torch

from layerplan.runtime.optim import load_state, sgd


def _pair(dtype):
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(257, 33, dtype=dtype)), torch.nn.Parameter(torch.randn(33, dtype=dtype))]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    return a, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_sgd_equals_the_loop_bit_for_bit(dtype):
    a, b = _pair(dtype)
    start = [p.detach().clone() for p in a]
    loop = torch.optim.SGD(a, lr=0.05, momentum=0.9, weight_decay=5e-4)
    fused = sgd(b, lr=0.05, momentum=0.9, weight_decay=5e-4)
    assert fused.param_groups[0]["fused"] is True
    for _ in range(6):
        grads = [torch.randn_like(p) for p in a]
        for p, q, g in zip(a, b, grads):
            p.grad, q.grad = g.clone(), g.clone()
        loop.step()
        fused.step()
    for p, q, p0 in zip(a, b, start):
        assert torch.equal(p, q)
        assert not torch.equal(p, p0)  # the steps moved it


def test_without_a_fused_kernel_it_falls_back_to_the_loop():
    p = torch.nn.Parameter(torch.randn(4, device="meta"))
    opt = sgd([p], lr=0.1)
    assert not opt.param_groups[0].get("fused")


def test_load_state_keeps_the_kernel_and_sets_the_hyperparameters():
    a, b = _pair(torch.float32)
    saved = torch.optim.SGD(a, lr=0.5, momentum=0.5)  # a checkpoint from a run with the loop
    for p in a:
        p.grad = torch.ones_like(p)
    saved.step()
    opt = sgd(b, lr=0.01, momentum=0.9)
    load_state(opt, saved.state_dict(), lr=0.02, momentum=0.8, weight_decay=0.0)
    group = opt.param_groups[0]
    assert group["fused"] is True and group["lr"] == 0.02 and group["momentum"] == 0.8
    assert torch.equal(opt.state[b[0]]["momentum_buffer"], torch.ones_like(b[0]))
