import json

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
