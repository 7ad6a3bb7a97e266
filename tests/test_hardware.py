import json
import math

import pytest

from layerplan import hardware
from layerplan.errors import LayerplanError, SpecError


def test_presets_cover_the_seeds_hardware():
    for d in ["titan-x", "titan-xp", "k20", "k20x", "k40", "k80", "v100", "h100", "xeon-e5-2450-node"]:
        assert d in hardware.DEVICES
    for n in ["c4.4xlarge", "c4.8xlarge", "g2.2xlarge", "g2.8xlarge", "p3.2xlarge", "xeon-e5-2450"]:
        assert n in hardware.NODES
    rates = sorted(link.bandwidth_bytes_per_s * 8 / 1e9 for link in hardware.LINKS.values())
    for r in [1, 2.6, 10, 25, 40, 56, 70, 100]:
        assert any(abs(x - r) < 1e-9 for x in rates)
    assert hardware.DEVICES["titan-x"].peak_flops_per_s == 6.1e12  # PALEO
    assert hardware.DEVICES["xeon-e5-2450-node"].peak_flops_per_s == pytest.approx(268.8e9)  # Yan §6


def test_cluster_file_yaml_with_units(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("""
name: lab
nodes: 3
device: {name: gpu, peak_flops_per_s: 6.1TFLOPS, mem_bandwidth_bytes_per_s: 336GB/s, memory_bytes: 12GiB}
nic: {name: eth, bandwidth_bytes_per_s: 10Gbit, latency_s: 50us, efficiency: 0.9}
shared_cores: 2
""")
    c = hardware.load_cluster(p)
    assert c.nodes == 3 and c.shared_cores == 2
    assert c.device.peak_flops_per_s == 6.1e12
    assert c.device.memory_bytes == 12 * 2**30
    assert c.nic.bandwidth_bytes_per_s == 1.25e9 and c.nic.latency_s == pytest.approx(50e-6)


def test_cluster_file_json_presets_and_round_trip(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"name": "x", "nodes": 2, "device": "v100", "nic": "25gbe"}))
    c = hardware.load_cluster(p)
    assert c.device.name == "v100" and c.nic.name == "25gbe"
    out = tmp_path / "again.yaml"
    hardware.save_cluster(c, out)
    assert hardware.load_cluster(out) == c


@pytest.mark.parametrize("text,match", [
    ("name: x\nnodes: 2\ndevice: v100\nnic: 10gbe\ncolour: red\n", "unknown key"),
    ("name: x\nnodes: 2\ndevice: v100\n", "missing key"),
    ("name: x\nnodes: 0\ndevice: v100\nnic: 10gbe\n", "nodes"),
    ("name: x\nnodes: 2\ndevice: v1000\nnic: 10gbe\n", "unknown device"),
    ("name: x\nnodes: 2\ndevice: v100\nnic: {name: e, bandwidth_bytes_per_s: 10Gbat}\n", "unknown unit"),
    ("name: x\nnodes: [2\n", "not valid YAML"),
    ("- 1\n- 2\n", "mapping"),
])
def test_bad_cluster_files(tmp_path, text, match):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(LayerplanError, match=match):
        hardware.load_cluster(p)


def test_resolve_cluster_overrides():
    c = hardware.resolve_cluster("p3.2xlarge", nodes=16, bandwidth="25Gbit")
    assert c.nodes == 16 and c.device.name == "v100" and c.nic.bandwidth_bytes_per_s == 25e9 / 8
    with pytest.raises(SpecError, match="unknown cluster preset"):
        hardware.resolve_cluster("p9.tiny")
    with pytest.raises(SpecError, match="cannot read"):
        hardware.resolve_cluster("missing.yaml")



def test_update_bandwidth_by_size_and_the_update_time_it_gives():
    from dataclasses import replace

    from layerplan.strategies.base import update_s

    dev = replace(hardware.device("cpu-core"), update_bandwidth=[[2**27, 16e9], [2**20, 25e9]])
    assert dev.update_bandwidth == ((2**20, 25e9), (2**27, 16e9))  # sorted, tuples
    assert dev.update_bytes_per_s(1e3) == 25e9 and dev.update_bytes_per_s(2**30) == 16e9  # nearest outside
    assert dev.update_bytes_per_s(2**23.5) == pytest.approx(20.5e9)  # halfway in log(size)
    c = hardware.cluster("local-cpu", nodes=2)
    big = replace(c, device=dev)
    assert update_s(2**27, big) == pytest.approx(5 * 2**27 / 16e9)  # SGD with momentum: 5 passes
    assert update_s(2**27, c) == pytest.approx(5 * 2**27 / c.device.mem_bandwidth_bytes_per_s)  # no curve
    for bad in ([[0, 1e9]], [[1e6, -1]], [["x", 1]], [[1e6]]):
        with pytest.raises(SpecError, match="update_bandwidth"):
            replace(dev, update_bandwidth=bad)
        with pytest.raises(SpecError, match="sum_bandwidth"):
            replace(dev, sum_bandwidth=bad)


def test_a_server_summing_gradients_pays_for_every_pass_of_the_sum():
    from dataclasses import replace

    from layerplan.strategies.base import sum_passes, update_s

    # runtime.roles.summed: one gradient as it came; n: the first two added into a third, then one add_ each
    assert [sum_passes(n) for n in (1, 2, 4)] == [0, 3, 9]
    assert sum_passes(4, averaged=True) == 11 and sum_passes(1, copied=True) == 2 and sum_passes(3, copied=True) == 8
    dev = replace(hardware.device("cpu-core"), update_bandwidth=[[2**27, 20e9]])
    c = replace(hardware.cluster("local-cpu", nodes=2), device=dev)
    assert dev.sum_bytes_per_s(2**27) == 20e9  # no sum curve: the update's
    assert update_s(2**27, c, gradients_summed=4, averaged=True) == pytest.approx(16 * 2**27 / 20e9)
    c = replace(c, device=replace(dev, sum_bandwidth=[[2**27, 12e9]]))
    assert update_s(2**27, c, gradients_summed=4, averaged=True) == pytest.approx(5 * 2**27 / 20e9 + 11 * 2**27 / 12e9)
    assert hardware.cluster_from_dict(c.to_dict()).device.sum_bandwidth == ((2**27, 12e9),)


def test_the_leading_flows_share_fades_with_the_flows_size():
    from layerplan.hardware import LinkSpec

    even = LinkSpec(name="l", bandwidth_bytes_per_s=1e9)
    assert even.lead_share(1e6) == 1.0
    link = LinkSpec(name="l", bandwidth_bytes_per_s=1e9, flow_lead_bytes=150e3)
    s = 1.1e6  # 4 flows of 1.1 MB from one host on the emulated link: the first done at ~0.7 of the fair time
    w = link.lead_share(s)
    assert w == pytest.approx(s / (s - math.sqrt(150e3 * s)))
    assert 0.6 < (w + 3) / (4 * w) < 0.8  # the first of 4 flows' finish over the fair time
    assert 1.0 < link.lead_share(60e6) < 1.06  # long flows share evenly (60 MB: the first at 0.95)
    assert link.lead_share(1e3) == pytest.approx(3.0)  # the lead is at most two thirds of the flow
    assert link.lead_share(0.0) == 1.0
    for bad in (-1.0, math.nan, True):
        with pytest.raises(SpecError, match="flow_lead_bytes"):
            LinkSpec(name="l", bandwidth_bytes_per_s=1e9, flow_lead_bytes=bad)


def test_staggered_shares_finish_flows_one_after_another():
    """stagger_shares: groups of flows leaving one NIC together, simulated with its weights, finish
    in turn — the first where lead_share's leader does, the rest evenly spaced up to when all the
    bytes have crossed (a group where its flows' mean falls, the last group then); a leader and the rest are lead_share's weights; no lead, even shares."""
    from layerplan.cost.engine import StepGraph, Transfer, simulate
    from layerplan.hardware import LinkSpec

    nic = LinkSpec(name="l", bandwidth_bytes_per_s=100e6, latency_s=0.0, flow_lead_bytes=150e3)
    c = hardware.ClusterSpec(name="c", nodes=7, device=hardware.DEVICES["cpu-core"], nic=nic)
    s = 1.1e6
    for counts in ((1, 1, 1, 1), (1, 1, 2), (2, 2, 1, 1), (1, 1, 1, 1, 1, 1)):
        w = nic.stagger_shares(s, counts)
        assert list(w) == sorted(w, reverse=True) and w[-1] == 1.0
        tasks = [Transfer(name=f"f{i}", src="src", dst=f"d{i}", bytes_per_flow=s, pattern="all_to_all", share=w[i])
                 for i in range(len(counts))]
        tl = simulate(StepGraph(groups={"src": 1, **{f"d{i}": c for i, c in enumerate(counts)}}, samples_per_step=1,
                                tasks=tuple(tasks)), c).timeline
        ends = [next(e.end_s for e in tl if e.name == f"f{i}") for i in range(len(counts))]
        n, total = sum(counts), sum(counts) * s / 100e6
        first = 1.0 - (n - 1) * math.sqrt(150e3 * s) / (n * s)
        at = [first + (1 - first) * k / (n - 1) for k in range(n)]
        k = 0
        for i, cnt in enumerate(counts[:-1]):  # a group ends where its flows' mean does, the last when all are in
            assert ends[i] == pytest.approx(total * sum(at[k:k + cnt]) / cnt, rel=1e-6)
            k += cnt
        assert ends[-1] == pytest.approx(total, rel=1e-9)
    assert nic.stagger_shares(s, (1, 3)) == pytest.approx((nic.lead_share(s), 1.0))
    assert LinkSpec(name="even", bandwidth_bytes_per_s=1e8).stagger_shares(s, (1, 1, 2)) == (1.0, 1.0, 1.0)
    with pytest.raises(SpecError, match="at least one flow"):
        nic.stagger_shares(s, (1, 0))


def test_a_measured_first_flows_finish_gives_back_the_flow_lead():
    """fit_flow_lead_bytes inverts lead_share: 4 flows simulated with the leader's share finish
    first at f of the last's time, and f gives back the link's flow_lead_bytes."""
    from layerplan.cost.engine import StepGraph, Transfer, simulate
    from layerplan.hardware import LinkSpec, fit_flow_lead_bytes

    for lead_bytes, s in ((150e3, 1.1e6), (150e3, 4.4e6), (400e3, 2e6)):
        nic = LinkSpec(name="l", bandwidth_bytes_per_s=100e6, latency_s=0.0, flow_lead_bytes=lead_bytes)
        c = hardware.ClusterSpec(name="c", nodes=5, device=hardware.DEVICES["cpu-core"], nic=nic)
        tasks = [Transfer(name=f"f{i}", src="src", dst=f"d{i}", bytes_per_flow=s, pattern="spread",
                          share=nic.lead_share(s) if i == 0 else 1.0) for i in range(4)]
        ends = sorted(e.end_s for e in simulate(StepGraph(groups={"src": 1, **{f"d{i}": 1 for i in range(4)}},
                                                          samples_per_step=1, tasks=tuple(tasks)), c).timeline)
        assert fit_flow_lead_bytes(4, s, ends[0] / ends[-1]) == pytest.approx(lead_bytes, rel=1e-6)
    assert fit_flow_lead_bytes(4, 1e6, 1.0) == 0.0  # even shares: no lead
    assert fit_flow_lead_bytes(4, 1e6, 0.25) == pytest.approx(1e6 * (2 / 3) ** 2)  # at most two thirds ahead
    for bad in ((1, 1e6, 0.5), (4, 0.0, 0.5), (4, 1e6, 0.0), (4, 1e6, 1.5)):
        with pytest.raises(SpecError, match="flow lead"):
            fit_flow_lead_bytes(*bad)


ZEN1 = """processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 23
model		: 1
model name	: AMD EPYC 7551 32-Core Processor
cpu MHz		: 1996.248
flags		: fpu sse sse2 avx fma avx2

processor	: 1
vendor_id	: AuthenticAMD
"""
ZEN4 = """processor : 0
vendor_id : AuthenticAMD
cpu family : 25
model : 17
model name : AMD EPYC
cpu MHz : 2596.138
flags : fpu sse avx fma avx2 avx512f avx512bw avx512_bf16
"""
SKYLAKE = """processor : 0
vendor_id : GenuineIntel
cpu family : 6
model : 85
model name : Intel(R) Xeon(R) Platinum 8175M CPU @ 2.50GHz
cpu MHz : 3100.000
flags : fpu sse avx fma avx2 avx512f avx512bw
"""


def test_this_cpu_is_told_by_its_vector_unit_and_nominal_clock():
    """this_cpu: peak = FLOP a cycle × the nominal clock (the model name's, else cpu MHz), the
    efficiency by the widest vector unit; a text without flags or clock gives None."""
    zen = hardware.this_cpu(ZEN1)
    assert zen.peak_flops_per_s == pytest.approx(16 * 1.996248e9) and zen.compute_efficiency == 0.85
    assert zen.kind == "cpu" and zen.cores == 1 and "AMD EPYC 7551" in zen.note
    sky = hardware.this_cpu(SKYLAKE)
    assert sky.peak_flops_per_s == pytest.approx(64 * 2.5e9) and sky.compute_efficiency == 0.7  # the cpu-core preset's
    zen4 = hardware.this_cpu(ZEN4)  # AVX-512 as two 256-bit halves, at its clock
    assert zen4.peak_flops_per_s == pytest.approx(32 * 2.596138e9) and zen4.compute_efficiency == 0.95
    assert hardware.cpu_flops_per_cycle({"avx2", "fma", "avx512f"}, "AuthenticAMD", 0x1A, 0x02) == 64  # Zen 5
    assert hardware.cpu_flops_per_cycle({"avx2", "fma"}, "AuthenticAMD", 0x17, 0x31) == 32  # Zen 2
    assert hardware.cpu_flops_per_cycle({"avx2", "fma"}, "GenuineIntel", 6, 63) == 32
    assert hardware.cpu_flops_per_cycle({"avx"}) == 16 and hardware.cpu_flops_per_cycle({"sse2"}) == 8
    assert hardware.this_cpu("processor : 0\nflags : avx2 fma\n") is None  # no clock
    assert hardware.this_cpu("") is None


def test_the_device_this_cpu_resolves_or_says_why_not(monkeypatch):
    monkeypatch.setattr(hardware, "this_cpu", lambda cpuinfo=None: None)  # no /proc/cpuinfo
    with pytest.raises(SpecError, match="cannot tell this machine's CPU"):
        hardware.device("this-cpu")
    assert hardware.local_device() == hardware.DEVICES["cpu-core"]
    monkeypatch.undo()
    real = hardware.this_cpu()
    if real is not None:  # a Linux machine
        assert hardware.device("This-CPU") == real == hardware.local_device()


def test_a_device_at_another_speed_computes_every_layer_at_that_speed():
    """At 0.8× its calibrated pace a device takes 1/0.8 of every measured layer time, at every
    batch and along its line, and reaches 0.8 of its efficiencies (never above 1); memory stays."""
    from dataclasses import replace

    from conftest import layer
    from layerplan.cost.compute import layer_time_s

    p = hardware.ProfiledLayer(key="k", fwd_fixed_s=1e-3, fwd_per_sample_s=1e-4, bwd_fixed_s=0.045,
                               bwd_per_sample_s=7.8e-4, batches=(16, 32), fwd_s=(2.6e-3, 4.2e-3), bwd_s=(0.0646, 0.0806))
    dev = replace(hardware.device("cpu-core"), compute_efficiency=0.6, fc_efficiency=0.9, profiled_layers=(p,))
    slow = dev.at_speed(0.8)
    q = slow.profiled("k")
    for batch in (8, 16, 24, 32, 128):
        for phase in ("fwd", "bwd"):
            assert q.time_s(batch, phase) == pytest.approx(p.time_s(batch, phase) / 0.8)
    assert slow.compute_efficiency == pytest.approx(0.48) and slow.fc_efficiency == pytest.approx(0.72)
    assert slow.update_bytes_per_s(1e6) == dev.update_bytes_per_s(1e6)
    fast = dev.at_speed(1.25)
    assert fast.compute_efficiency == pytest.approx(0.75) and fast.fc_efficiency == 1.0  # capped
    assert dev.at_speed(1.0) is dev
    conv = layer("c", "conv", params=0, out=(1,), fwd=10**10)  # no profile: its FLOPs at the efficiency
    assert layer_time_s(conv, slow, 16, direction="fwd") == pytest.approx(
        layer_time_s(conv, dev, 16, direction="fwd") / 0.8, rel=1e-6)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(SpecError, match="speed"):
            dev.at_speed(bad)


def test_a_device_at_another_memory_speed_paces_the_layers_that_are_not_matrix_products_by_it():
    """With ``memory_speed`` a device's measured convolutions and matrix products take their times
    over the compute speed, every other layer (batch norm, ReLU, pooling) over the memory speed;
    at both speeds 1 it is itself."""
    from dataclasses import replace

    def prof(op):
        return hardware.ProfiledLayer(key=f"{op}|in=1|out=1|p=0|f=0|b=0", fwd_fixed_s=1e-3, fwd_per_sample_s=1e-4,
                                      bwd_fixed_s=2e-3, bwd_per_sample_s=2e-4, batches=(16, 32),
                                      fwd_s=(2.6e-3, 4.2e-3), bwd_s=(5.2e-3, 8.4e-3))
    ops = ("Conv2d", "Linear", "BatchNorm2d", "ReLU", "MaxPool2d")
    dev = replace(hardware.device("cpu-core"), profiled_layers=tuple(prof(op) for op in ops))
    paced = dev.at_speed(0.9, memory_speed=0.5)
    for op in ops:
        by = 0.9 if op in hardware.COMPUTE_BOUND_OPS else 0.5
        p, q = dev.profiled(prof(op).key), paced.profiled(prof(op).key)
        for batch in (8, 16, 24, 64):
            for phase in ("fwd", "bwd"):
                assert q.time_s(batch, phase) == pytest.approx(p.time_s(batch, phase) / by)
    assert paced.compute_efficiency == pytest.approx(dev.compute_efficiency * 0.9)
    assert dev.at_speed(1.0, memory_speed=1.0) is dev
    assert dev.at_speed(1.0, memory_speed=0.5).profiled(prof("ReLU").key).time_s(16, "fwd") == pytest.approx(5.2e-3)
    with pytest.raises(SpecError, match="speed"):
        dev.at_speed(1.0, memory_speed=0.0)


def test_a_clusters_busy_ring_cost_is_checked_and_kept():
    from dataclasses import replace

    c = hardware.cluster("local-cpu", nodes=2, shared_cores=2)
    assert c.collective_busy_cpu_s_per_byte is None
    busy = replace(c, collective_busy_cpu_s_per_byte=2e-9)
    assert hardware.cluster_from_dict(busy.to_dict()).collective_busy_cpu_s_per_byte == 2e-9
    for bad in (-1e-9, float("nan"), "2ns"):
        with pytest.raises(SpecError, match="collective_busy_cpu_s_per_byte"):
            replace(c, collective_busy_cpu_s_per_byte=bad)
    assert c.collective_core_share is None
    assert hardware.cluster_from_dict(replace(c, collective_core_share=0.75).to_dict()).collective_core_share == 0.75
    for bad in (0.0, 1.5, float("nan"), True):
        with pytest.raises(SpecError, match="collective_core_share"):
            replace(c, collective_core_share=bad)


def test_the_cluster_table_says_what_a_collectives_cpu_costs(monkeypatch):
    import io
    from dataclasses import replace

    from rich.console import Console

    from layerplan import report

    out = io.StringIO()
    monkeypatch.setattr(report, "_CONSOLE", Console(file=out, width=400))
    c = hardware.cluster("local-cpu", nodes=2, shared_cores=2)
    report.print_cluster(c)
    assert "of a core a rank busy" not in out.getvalue() and "beside its ranks' compute" not in out.getvalue()
    report.print_cluster(replace(c, collective_busy_cpu_s_per_byte=2e-9, collective_core_share=0.73))
    assert "a collective's bytes beside its ranks' compute take 2.0 ns of CPU each" in out.getvalue()
    assert "a collective's thread keeps at most 0.73 of a core a rank busy" in out.getvalue()
