"""PALEO layer times (§3.1.1 eq.1, §3.1.3) and the memory check."""

from __future__ import annotations

import math

import pytest

from conftest import layer, make_net
from layerplan.cost import compute
from layerplan.cost.compute import ConvGeometry
from layerplan.errors import ConfigError
from layerplan.hardware import DeviceSpec, device

DEV = DeviceSpec(name="dev", peak_flops_per_s=2e12, mem_bandwidth_bytes_per_s=100e9, memory_bytes=4 * 2**30,
                 compute_efficiency=0.5)
SPEED = 1e12  # achieved FLOP/s
MEM = 100e9


def small_net():
    # input 3×8×8 fp32 = 768 B per sample; a conv, a relu, an fc.
    return make_net([
        layer("c1", "conv", (), params=448, out=(16, 8, 8), fwd=1_000_000, bwd=1_500_000),
        layer("r1", "act", ("c1",), out=(16, 8, 8), fwd=1024),
        layer("f1", "fc", ("r1",), params=10_250, out=(10,), fwd=20_480),
    ], boundary="r1")


def test_forward_is_r_plus_c_plus_w():
    net = small_net()
    c1 = net.layer("c1")
    batch = 32
    in_b = 3 * 8 * 8 * 4
    # PALEO §3.1.1 eq.1: read inputs (+ weights), compute, write outputs.
    want = (in_b * batch + c1.param_bytes) / MEM + c1.fwd_flops * batch / SPEED + c1.out_bytes * batch / MEM
    got = compute.layer_time_s(c1, DEV, batch, direction="fwd", in_bytes=in_b)
    assert got == pytest.approx(want)


def test_backward_accounting():
    net = small_net()
    f1, r1 = net.layer("f1"), net.layer("r1")
    batch = 8
    in_b = r1.out_bytes
    # reads output-grad + saved input + weights; writes input-grad + weight-grad
    read = (f1.out_bytes + in_b) * batch + f1.param_bytes
    write = in_b * batch + f1.param_bytes
    want = read / MEM + f1.bwd_flops * batch / SPEED + write / MEM
    assert compute.layer_time_s(f1, DEV, batch, direction="bwd", in_bytes=in_b) == pytest.approx(want)
    # a layer that reads the network input writes no input-gradient
    c1 = net.layer("c1")
    in0 = 768
    want0 = ((c1.out_bytes + in0) * batch + c1.param_bytes) / MEM + c1.bwd_flops * batch / SPEED + c1.param_bytes / MEM
    assert compute.layer_time_s(c1, DEV, batch, direction="bwd", in_bytes=in0) == pytest.approx(want0)


def test_phase_is_the_sum_of_layer_times_and_reads_parents():
    net = small_net()
    batch = 4
    want = 0.0
    for lay, in_b in zip(net.layers, (768, net.layer("c1").out_bytes, net.layer("r1").out_bytes)):
        want += compute.layer_time_s(lay, DEV, batch, direction="fwd", in_bytes=in_b)
    assert compute.phase_time_s(net, net.layers, DEV, batch, "fwd") == pytest.approx(want)
    both = compute.fwd_bwd_time_s(net, net.conv_layers, DEV, batch)
    assert both == pytest.approx(compute.phase_time_s(net, net.conv_layers, DEV, batch, "fwd")
                                 + compute.phase_time_s(net, net.conv_layers, DEV, batch, "bwd"))


def test_dag_branches_run_sequentially():
    # PALEO: a single device runs parallel branches one after the other: a merge reads both parents.
    net = make_net([
        layer("a", "conv", (), params=10, out=(4, 4, 4), fwd=1000),
        layer("b1", "conv", ("a",), params=10, out=(4, 4, 4), fwd=2000),
        layer("b2", "conv", ("a",), params=10, out=(4, 4, 4), fwd=3000),
        layer("m", "merge", ("b1", "b2"), out=(4, 4, 4), fwd=64),
    ], boundary=None, input_shape=(4, 4, 4))
    total = compute.phase_time_s(net, net.layers, DEV, 2, "fwd")
    parts = sum(compute.phase_time_s(net, [lay], DEV, 2, "fwd") for lay in net.layers)
    assert total == pytest.approx(parts)
    assert compute.input_bytes(net, net.layer("m")) == 2 * 4 * 4 * 4 * 4


def test_paleo_gemm_flops_and_fft_option():
    g = ConvGeometry(filters=64, channels=3, kernel_h=11, kernel_w=11, out_h=55, out_w=55)
    # PALEO §3.1.3: 2·K·C·R·S·N·P·Q
    assert g.gemm_flops(1) == 2 * 64 * 3 * 11 * 11 * 55 * 55
    n = (55 + 10) * (55 + 10)
    assert g.transform_size == n
    want = 5 * n * math.log2(n) * (32 * 3 + 64 * 3 + 32 * 64) + 8 * 32 * 64 * 3 * n  # 5 n log2 n per transform
    assert g.fft_flops(32) == pytest.approx(want)


def test_conv_algorithm_choice():
    big = ConvGeometry(filters=256, channels=256, kernel_h=11, kernel_w=11, out_h=27, out_w=27)
    conv = layer("c", "conv", (), params=256 * 256 * 121, out=(256, 27, 27), fwd=int(big.gemm_flops(1)))
    kw = {"direction": "fwd", "in_bytes": 256 * 27 * 27 * 4}
    gemm = compute.layer_time_s(conv, DEV, 32, **kw)
    fft = compute.layer_time_s(conv, DEV, 32, conv_algorithm="fft", geometry=big, **kw)
    auto = compute.layer_time_s(conv, DEV, 32, conv_algorithm="auto", geometry=big, **kw)
    assert fft < gemm  # large kernels: FFT wins
    assert auto == pytest.approx(min(fft, gemm))
    one = ConvGeometry(filters=64, channels=64, kernel_h=1, kernel_w=1, out_h=56, out_w=56)
    pw = layer("p", "conv", (), params=64 * 64, out=(64, 56, 56), fwd=int(one.gemm_flops(1)))
    kw1 = {"direction": "fwd", "in_bytes": 64 * 56 * 56 * 4}
    assert compute.layer_time_s(pw, DEV, 32, conv_algorithm="auto", geometry=one, **kw1) == pytest.approx(
        compute.layer_time_s(pw, DEV, 32, **kw1))  # 1×1 kernels: GEMM wins
    # the FFT path needs the geometry for conv layers, and ignores other kinds
    with pytest.raises(ConfigError, match="ConvGeometry"):
        compute.layer_time_s(conv, DEV, 32, conv_algorithm="fft", **kw)
    fc = layer("f", "fc", (), params=100, out=(10,), fwd=2000)
    assert compute.layer_time_s(fc, DEV, 1, direction="fwd", conv_algorithm="fft") == compute.layer_time_s(fc, DEV, 1, direction="fwd")
    # and phase_time_s passes geometries by layer name
    net = make_net([conv], boundary=None, input_shape=(256, 27, 27))
    assert compute.phase_time_s(net, net.layers, DEV, 32, "fwd", conv_algorithm="fft", geometries={"c": big}) == pytest.approx(fft)


def test_bad_arguments():
    net = small_net()
    with pytest.raises(ConfigError, match="direction"):
        compute.phase_time_s(net, net.layers, DEV, 1, "sideways")
    with pytest.raises(ConfigError, match="conv_algorithm"):
        compute.layer_time_s(net.layers[0], DEV, 1, direction="fwd", conv_algorithm="winograd")
    with pytest.raises(ConfigError, match="batch"):
        compute.layer_time_s(net.layers[0], DEV, -1, direction="fwd")
    with pytest.raises(ConfigError, match="geometry"):
        ConvGeometry(filters=0, channels=1, kernel_h=1, kernel_w=1, out_h=1, out_w=1)


def test_time_scales_with_batch_and_efficiency(alexnetish):
    titan = device("titan-x")
    t32 = compute.fwd_bwd_time_s(alexnetish, alexnetish.layers, titan, 32)
    t64 = compute.fwd_bwd_time_s(alexnetish, alexnetish.layers, titan, 64)
    assert t32 < t64 < 2 * t32  # weight traffic is per step, not per sample
    flops = (alexnetish.fwd_flops + alexnetish.bwd_flops) * 32
    assert t32 > flops / titan.achieved_flops_per_s
    assert compute.phase_time_s(alexnetish, alexnetish.layers, titan, 0, "fwd") > 0  # weights still read


def test_peak_memory():
    net = small_net()
    batch = 16
    params = sum(lay.param_bytes for lay in net.layers)
    acts = sum(lay.out_bytes for lay in net.layers) + 768  # + the network input
    assert compute.peak_memory_bytes(net, net.layers, batch) == params * 3 + acts * batch
    assert compute.peak_memory_bytes(net, net.layers, batch, optimizer_slots=2, comm_buffer_bytes=1000) == \
        params * 4 + acts * batch + 1000
    # the FC part alone keeps the activations it receives from the conv part
    fc = net.fc_layers
    want = net.layer("f1").param_bytes * 3 + (net.layer("f1").out_bytes + net.layer("r1").out_bytes) * batch
    assert compute.peak_memory_bytes(net, fc, batch) == want
    # half precision halves every byte of the spec, not the buffers given in bytes
    assert compute.peak_memory_bytes(net, fc, batch, dtype_bytes=2, comm_buffer_bytes=10) == want // 2 + 10


def test_dtype_rescales_bytes_not_flops():
    net = small_net()
    f1 = net.layer("f1")
    in_b = net.layer("r1").out_bytes
    full = compute.phase_time_s(net, [f1], DEV, 8, "fwd")
    half = compute.phase_time_s(net, [f1], DEV, 8, "fwd", dtype_bytes=2)
    flops_s = f1.fwd_flops * 8 / SPEED
    assert half - flops_s == pytest.approx((full - flops_s) / 2)
    assert compute.phase_time_s(net, [f1], DEV, 8, "fwd", dtype_bytes=4) == full
    assert compute.layer_time_s(f1, DEV, 8, direction="fwd", in_bytes=in_b, bytes_scale=0.5) == pytest.approx(half)


def test_check_fits_message():
    titan = device("titan-x")
    compute.check_fits(11 * 2**30, titan, "the FC worker")
    with pytest.raises(ConfigError) as e:
        compute.check_fits(14.2 * 2**30, titan, "the FC worker")
    assert str(e.value) == "the FC worker needs 14.2 GiB on a 12 GiB titan-x"


def test_no_torch_under_cost():
    import pathlib

    import layerplan.cost as cost

    for path in pathlib.Path(cost.__file__).parent.glob("*.py"):
        text = path.read_text()
        assert "import torch" not in text and "from torch" not in text, path


def test_fc_layers_use_their_own_efficiency_where_given():
    """PALEO §3.3: PPP per layer type. fc_efficiency changes FC layers only; None keeps one figure."""
    dev = DeviceSpec(name="d", peak_flops_per_s=1e12, mem_bandwidth_bytes_per_s=1e30, memory_bytes=1e9,
                     compute_efficiency=0.5)
    fc = layer("fc", "fc", ("x",), params=1000, out=(10,), fwd=2000)
    conv = layer("c", "conv", ("x",), params=1000, out=(10,), fwd=2000)
    base_fc = compute.layer_time_s(fc, dev, 8, direction="fwd", in_bytes=0)
    base_conv = compute.layer_time_s(conv, dev, 8, direction="fwd", in_bytes=0)
    assert base_fc == pytest.approx(8 * 2000 / 0.5e12) == pytest.approx(base_conv)
    slow = DeviceSpec(name="d", peak_flops_per_s=1e12, mem_bandwidth_bytes_per_s=1e30, memory_bytes=1e9,
                      compute_efficiency=0.5, fc_efficiency=0.2)
    assert compute.layer_time_s(fc, slow, 8, direction="fwd", in_bytes=0) == pytest.approx(8 * 2000 / 0.2e12)
    assert compute.layer_time_s(conv, slow, 8, direction="fwd", in_bytes=0) == pytest.approx(base_conv)
    with pytest.raises(Exception, match="fc_efficiency"):
        DeviceSpec(name="d", peak_flops_per_s=1e12, mem_bandwidth_bytes_per_s=1e9, memory_bytes=1e9, fc_efficiency=0)


def test_kernel_costs_add_per_call_per_input_byte_and_weight_passes():
    """hardware.KernelCost: what an op's kernel costs beyond R + C + W, by op, on devices that list it."""
    from dataclasses import replace

    from layerplan.hardware import KernelCost, ProfiledLayer

    pool = layer("p", "pool", ("x",), out=(16, 4, 4))
    fc = layer("f", "fc", ("x",), params=1000, out=(10,), fwd=2000)
    cost = KernelCost(op="pool", fwd_fixed_s=1e-4, bwd_fixed_s=3e-4, fwd_s_per_input_byte=2e-9,
                      bwd_s_per_input_byte=1e-9, bwd_weight_passes=2.0)
    dev = replace(DEV, kernel_costs=(cost, KernelCost(op="fc", fwd_weight_passes=3.0)))
    in_b = 16 * 8 * 8 * 4
    for direction, extra in (("fwd", 1e-4 + 2e-9 * in_b * 32), ("bwd", 3e-4 + 1e-9 * in_b * 32)):
        plain = compute.layer_time_s(pool, DEV, 32, direction=direction, in_bytes=in_b)
        assert compute.layer_time_s(pool, dev, 32, direction=direction, in_bytes=in_b) == pytest.approx(plain + extra)
    plain = compute.layer_time_s(fc, DEV, 8, direction="fwd", in_bytes=64)
    assert compute.layer_time_s(fc, dev, 8, direction="fwd", in_bytes=64) == pytest.approx(plain + 3 * 4000 / MEM)
    # an op without an entry, and a profiled layer, take none of it
    relu = layer("r", "act", ("x",), out=(16, 4, 4))
    assert compute.layer_time_s(relu, dev, 8, direction="bwd", in_bytes=1024) == compute.layer_time_s(
        relu, DEV, 8, direction="bwd", in_bytes=1024)
    key = compute.profile_key(pool, in_b)
    profiled = replace(dev, profiled_layers=(ProfiledLayer(key=key, fwd_fixed_s=0.0, fwd_per_sample_s=1e-5,
                                                           bwd_fixed_s=0.0, bwd_per_sample_s=2e-5),))
    assert compute.layer_time_s(pool, profiled, 32, direction="fwd", in_bytes=in_b) == pytest.approx(32e-5)
    # a device at half its pace takes twice the kernel's time, its weight passes at the memory's
    half = dev.at_speed(0.5)
    assert half.kernel_cost("pool").fwd_fixed_s == pytest.approx(2e-4)
    assert half.kernel_cost("fc").fwd_weight_passes == 3.0


def test_cpu_presets_carry_pytorchs_kernel_costs_and_gpus_none():
    from layerplan import hardware

    core = device("cpu-core")
    assert {k.op for k in core.kernel_costs} == set(hardware.CPU_KERNEL_CYCLES)
    pool = core.kernel_cost("MaxPool2d")
    assert pool.fwd_s_per_input_byte == pytest.approx(hardware.CPU_KERNEL_CYCLES["MaxPool2d"][2] / 2.5e9)
    faster = hardware.cpu_kernel_costs(5e9)
    assert {k.op: k for k in faster}["MaxPool2d"].fwd_s_per_input_byte == pytest.approx(pool.fwd_s_per_input_byte / 2)
    assert device("titan-x").kernel_costs == () and device("xeon-e5-2450-node").kernel_costs == ()
    cpuinfo = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\n"
               "model name\t: Intel(R) Xeon(R) CPU @ 2.00GHz\nflags\t\t: fpu avx avx2 fma avx512f\n")
    this = hardware.this_cpu(cpuinfo)
    assert this.kernel_cost("Dropout").fwd_fixed_s == pytest.approx(hardware.CPU_KERNEL_CYCLES["Dropout"][0] / 2e9)


def test_kernel_costs_are_checked_and_survive_a_cluster_file(tmp_path):
    from dataclasses import replace

    from layerplan import hardware
    from layerplan.errors import SpecError

    with pytest.raises(SpecError, match="non-negative"):
        hardware.KernelCost(op="ReLU", bwd_fixed_s=-1e-6)
    with pytest.raises(SpecError, match="twice"):
        replace(DEV, kernel_costs=(hardware.KernelCost(op="ReLU"), hardware.KernelCost(op="ReLU")))
    spec = replace(hardware.cluster("local-cpu", nodes=2), device=device("cpu-core"))
    path = tmp_path / "c.yaml"
    hardware.save_cluster(spec, path)
    assert hardware.load_cluster(path) == spec
    path.write_text(path.read_text().replace("fwd_fixed_s: ", "fwd_fixed_s: -", 1))
    with pytest.raises(SpecError, match="kernel cost .Conv2d.: fwd_fixed_s"):
        hardware.load_cluster(path)
