"""Calibration: the fits recover what generated their data, the cluster file round-trips through
layerplan's loader (and the CLI), and one real point-to-point measurement gives a positive rate."""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import replace

import pytest

from layerplan import calibrate, cli, hardware
from layerplan.errors import ConfigError, SpecError


def test_fit_link_ignores_a_token_bucket_burst():
    """Messages up to the tbf burst (125 kB at 1 Gbit/s) pass at the veth's speed: the slope must
    come from the large ones, or the bandwidth comes out above the line rate."""
    sizes, burst, rate, lat = list(calibrate.P2P_SIZES_BYTES), 125_000, 125e6 * 0.956, 70e-6
    times = [2 * lat + max(0, n - burst) / rate + min(n, burst) / 1.2e9 for n in sizes]
    a, b = calibrate.fit_link(sizes, times)
    assert b == pytest.approx(rate, rel=0.01) and a == pytest.approx(2 * lat, rel=0.1)


def test_fit_link_recovers_latency_and_bandwidth_exactly():
    sizes = list(calibrate.P2P_SIZES_BYTES)
    for intercept_s, bw in [(150e-6, 1.2e9), (2e-3, 11.95e6), (0.0, 5e9)]:
        times = [intercept_s + n / bw for n in sizes]
        a, b = calibrate.fit_link(sizes, times)
        assert a == pytest.approx(intercept_s, rel=1e-9, abs=1e-15)
        assert b == pytest.approx(bw, rel=1e-9)


def test_fit_link_clamps_a_negative_intercept_and_rejects_too_few_points():
    sizes = [1024, 1 << 20, 16 << 20]
    a, b = calibrate.fit_link(sizes, [n / 1e9 - 1e-6 for n in sizes])
    assert a == 0.0 and b == pytest.approx(1e9, rel=1e-9)
    with pytest.raises(calibrate.CalibrationError, match="two different message sizes"):
        calibrate.fit_link([1024, 1024], [1e-4, 1e-4])
    with pytest.raises(calibrate.CalibrationError, match="positive sizes and times"):
        calibrate.fit_link([1024, 2048], [1e-4, 0.0])


def _layers():
    def layer(key, kind, batch, count, flops_per_sample, fwd_share, in_b, out_b, p_b, first=False):
        return {"key": key, "kind": kind, "op": "Conv2d" if kind == "conv" else "Linear", "batch": batch,
                "count": count, "first": first, "flops": flops_per_sample * batch,
                "fwd_flops": int(flops_per_sample * fwd_share) * batch, "in_bytes": in_b, "out_bytes": out_b,
                "param_bytes": p_b}

    return [layer("c1@16", "conv", 16, 2, 3 * 3_538_944, 1 / 3, 12288, 262144, 7168, first=True),
            layer("c2@16", "conv", 16, 1, 3 * 150_994_944, 1 / 3, 262144, 262144, 147712),
            layer("f1@64", "fc", 64, 2, 3 * 33_554_432, 1 / 3, 16384, 16384, 16_781_312)]


def test_fit_compute_efficiency_inverts_the_engines_layer_time():
    from layerplan.cost.compute import layer_time_s

    layers = _layers()
    device = hardware.DEVICES["cpu-core"]
    for eff in (0.31, 0.63, 0.9):
        truth = replace(device, compute_efficiency=eff)
        times = {}
        for layer in layers:
            spec = calibrate.layer_spec(layer)
            times[layer["key"]] = sum(layer_time_s(spec, truth, layer["batch"], direction=d, in_bytes=layer["in_bytes"])
                                      for d in ("fwd", "bwd"))
        assert calibrate.fit_compute_efficiency(layers, times, device) == pytest.approx(eff, rel=1e-9)
    with pytest.raises(calibrate.CalibrationError, match="faster than the preset's memory bandwidth"):
        calibrate.fit_compute_efficiency(layers, {k: 1e-12 for k in times}, device)


def test_spread_and_bus_bandwidth():
    s = calibrate.spread([2.0, 1.0, 4.0])
    assert s["median"] == 2.0 and s["spread"] == 1.5
    assert calibrate.lower_quartile([5.0, 1.0, 2.0, 3.0, 4.0]) == 2.0
    assert calibrate.lower_quartile([1.0, 2.0]) == 1.25
    assert calibrate.bus_bytes_per_s(1000, 2, 1.0) == 1000  # nccl-tests: busBw = algBw · 2(n−1)/n
    assert calibrate.bus_bytes_per_s(900, 3, 1.0) == pytest.approx(1200)


def test_reduce_cost_takes_the_point_to_point_rate_at_the_all_reduces_size():
    """c_red = 2·(1/bus − 2/R) with R measured at the all-reduce's message size where the
    point-to-point sizes include it (the slope over all sizes reads faster than 16 MiB messages)."""
    s = calibrate.spread
    link = {"configured_bytes_per_s": None, "payload_bytes_per_s": s([5e9]), "sizes_bytes": [2**20, 2**24],
            "p2p_time_s": [2**20 / 5e9, 2**24 / 4e9], "allreduce": {"2": {"bytes": 2**24, "bus_bytes_per_s": s([1.6e9])}}}
    comm, red = calibrate.comm_cpu_costs(link)
    assert comm == pytest.approx(1 / 5e9)
    assert red == pytest.approx(2 * (1 / 1.6e9 - 2 / 4e9))
    del link["sizes_bytes"]  # no time at that size: the fitted rate
    assert calibrate.comm_cpu_costs(link)[1] == pytest.approx(2 * (1 / 1.6e9 - 2 / 5e9))
    assert calibrate.comm_cpu_costs({**link, "configured_bytes_per_s": 1.25e8}) == (0.0, 0.0)  # emulated: no CPU cost


def fake_result(on="emulated", eff=0.62, payload=119.5e6):
    s = calibrate.spread
    return {
        "format": 1, "on": on, "cluster": "lab" if on == "emulated" else None, "repeats": 2, "quick": True,
        "machine": {"cpu": "test cpu", "cores": 2, "python": "3", "when": "2026-01-01 00:00:00"},
        "compute": {"device_preset": "cpu-core", "peak_flops_per_s": 160e9, "shared_processes": 2,
                    "compute_efficiency": s([eff, eff * 1.01]), "per_thread_flops_per_s": s([95e9, 96e9]),
                    "per_thread_conv_flops_per_s": s([105e9]), "per_thread_linear_flops_per_s": s([40e9]),
                    "shared_flops_per_s": s([180e9, 185e9]), "share_of_peak_per_thread": s([0.6]),
                    "effective_cores": s([1.9]), "mem_bandwidth_bytes_per_s": 24e9,
                    "update_bandwidth": [[2**20, 25e9], [2**27, 16e9]], "sum_bandwidth": [[2**20, 20e9], [2**27, 12e9]]},
        "link": {"where": "somewhere", "configured_bytes_per_s": 125e6 if on == "emulated" else None, "ranks": 3,
                 "latency_s": s([80e-6, 90e-6]), "payload_bytes_per_s": s([payload, payload * 1.001]),
                 **({"efficiency": s([payload / 125e6])} if on == "emulated" else {}),
                 "allreduce": {"2": {"bytes": 2**24, "bus_bytes_per_s": s([118e6]), "vs_p2p": s([0.99]),
                                     **({"efficiency": s([0.944])} if on == "emulated" else {})}}},
        "rounds": {"bytes": 4096, "round_s": {"2": s([0.15e-3]), "4": s([0.75e-3])}, "oversubscribed_wait_s": 0.6e-3,
                   "messages": {"ranks": 4, "burst_cpu_s": 0.035, "cpu_s_per_end": s([0.5e-3, 0.6e-3]),
                                "oversubscribed_message_cpu_s": 0.55e-3}},
        "synchronized_steps": {"processes": [1, 2, 4], "cores": 2, "batch": 16,
                               "per_net": {"resnet_cifar": {"capacity": s([1.8, 1.82]), "oversubscribed_capacity": s([1.7]),
                                                            "collective_wait_s": s([1.1e-3, 0.9e-3])}},
                               "capacity": s([1.8, 1.82]), "oversubscribed_capacity": s([1.7]),
                               "collective_wait_s": s([1.1e-3, 0.9e-3])},
    }


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@pytest.mark.parametrize("on", ["emulated", "local"])
def test_cluster_file_round_trips_through_the_loader_and_the_cli(tmp_path, capsys, suffix, on):
    result = fake_result(on)
    path = tmp_path / f"calibrated{suffix}"
    spec = calibrate.save(result, path, nodes=3)
    assert spec == calibrate.to_cluster(result, nodes=3)
    assert hardware.load_cluster(path) == spec
    assert hardware.resolve_cluster(str(path)) == spec
    assert spec.device.compute_efficiency == pytest.approx(result["compute"]["compute_efficiency"]["median"])
    assert spec.shared_cores == 2 and spec.nodes == 3 and spec.device.kind == "cpu"
    assert spec.device.kernel_costs == ()  # its efficiencies were fitted without the preset's kernel costs
    assert spec.oversubscribed_wait_s == pytest.approx(0.6e-3)
    assert spec.oversubscribed_message_cpu_s == pytest.approx(0.55e-3)
    assert spec.shared_core_capacity == pytest.approx(1.81)  # the cores' worth of steps in lockstep
    assert spec.oversubscribed_core_capacity == pytest.approx(1.7)
    assert spec.collective_wait_s == pytest.approx(1e-3)  # one more collective a step in lockstep
    assert spec.device.update_bandwidth == ((2**20, 25e9), (2**27, 16e9))
    assert spec.device.sum_bandwidth == ((2**20, 20e9), (2**27, 12e9))
    if on == "emulated":
        assert spec.nic.bandwidth_bytes_per_s == 125e6 and spec.nic.efficiency == pytest.approx(0.956, rel=1e-3)
        assert spec.nic.duplex_efficiency == pytest.approx(118e6 / 119.5e6, rel=1e-3)  # the all-reduce's bus rate, both ways
    else:
        assert spec.nic.payload_bytes_per_s == pytest.approx(119.5e6, rel=1e-3)
    assert spec.nic.latency_s == pytest.approx(85e-6)
    if suffix == ".yaml":
        assert path.read_text().startswith("# layerplan calibrate --on ")
        assert "550 µs of CPU at each end (oversubscribed_message_cpu_s; the geometric mean of 2" in path.read_text()
    assert cli.main(["hardware", "--cluster", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == spec.to_dict()


def test_a_machine_faster_than_the_preset_keeps_its_measured_rate():
    spec = calibrate.to_cluster(fake_result("local", eff=1.25), nodes=2)
    assert spec.device.compute_efficiency == 1.0
    assert spec.device.achieved_flops_per_s == pytest.approx(1.25 * 1.005 * 160e9)  # the median of the two


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="'local' or 'emulated'"):
        calibrate.calibrate(on="cloud")
    with pytest.raises(ConfigError, match="repeats"):
        calibrate.calibrate(repeats=0)
    with pytest.raises(ConfigError, match="multiples of 4"):
        calibrate.measure_links(sizes=[1024, 1023])
    with pytest.raises(calibrate.CalibrationError, match="not a calibration result"):
        calibrate.to_cluster({"compute": {}})


def test_benchmark_messages_are_never_lost_whatever_order_they_arrive_in(tmp_path):
    """Rank 1 says "done" long before rank 0 reports: waiting for rank 0 must not eat rank 1's line."""
    import sys

    say = "import json, time, sys; time.sleep({}); [print(json.dumps({{'event': e}}), flush=True) for e in {}]"
    argvs = [[sys.executable, "-c", say.format(0.3, ["repeat", "done"])], [sys.executable, "-c", say.format(0, ["done"])]]
    procs = calibrate._Procs(argvs, [None, None], tmp_path)
    try:
        assert procs.expect("repeat", [0]) == {0: {"event": "repeat"}}
        assert set(procs.expect("done", 2)) == {0, 1}
    finally:
        procs.close()
    bad = calibrate._Procs([[sys.executable, "-c", "import sys; sys.exit('boom')"]], [None], tmp_path)
    try:
        with pytest.raises(calibrate.CalibrationError, match=r"process 0 exited with code 1 before it finished \(boom\)"):
            bad.expect("ready", 1)
    finally:
        bad.close()


@pytest.mark.dist
def test_a_real_loopback_measurement_gives_a_positive_rate():
    """16 MiB (milliseconds on loopback) keeps the slope clear of a busy machine's scheduling hiccups."""
    link = calibrate.measure_links("local", repeats=1, quick=True, sizes=[1024, 16 << 20], ranks=2)
    assert link["payload_bytes_per_s"]["median"] > 0 and link["latency_s"]["median"] >= 0
    assert len(link["p2p_time_s"]) == 2 and all(t > 0 for t in link["p2p_time_s"])
    assert link["allreduce"]["2"]["bus_bytes_per_s"]["median"] > 0


# ---- profiled layers -------------------------------------------------------------------------
def test_a_ring_round_with_more_ranks_than_cores_is_measured(tmp_path):
    """A small all-reduce among as many processes as cores and among twice as many: a round's time
    at each, and the wait the extra ranks add (never negative; nothing to measure past 8 cores)."""
    assert calibrate.round_ranks(1) == [2] and calibrate.round_ranks(2) == [2, 4] and calibrate.round_ranks(16) == []
    out = calibrate.measure_rounds(2, 1, tmp_path)
    assert set(out["round_s"]) == {"2", "4"} and all(r["median"] > 0 for r in out["round_s"].values())
    assert out["oversubscribed_wait_s"] == pytest.approx(
        max(0.0, out["round_s"]["4"]["median"] - min(out["round_s"]["2"]["values"])))
    assert calibrate.measure_rounds(1, 1, tmp_path)["oversubscribed_wait_s"] == 0.0  # one count: no difference


def test_a_messages_cpu_on_oversubscribed_cores_is_measured(tmp_path, monkeypatch):
    """Twice as many ranks as cores in pairs, a burst of compute and a round trip each: every
    rank's CPU beyond its bursts per message end, each repeat; their geometric mean is the
    cluster's figure (positive, between the least and the most; nothing measured past 8 cores)."""
    monkeypatch.setattr(calibrate, "MESSAGE_ROUNDTRIPS", 4)
    monkeypatch.setattr(calibrate, "MESSAGE_BURST_MATMULS", 4)
    monkeypatch.setattr(calibrate, "MESSAGE_REPEATS", 2)
    out = calibrate.measure_message_cpu(2, 1, tmp_path)
    assert out["ranks"] == 4 and len(out["cpu_s_per_end"]["values"]) == 4 * 2 and out["burst_cpu_s"] > 0
    vals = [max(v, calibrate.MESSAGE_FLOOR_S) for v in out["cpu_s_per_end"]["values"]]
    assert out["oversubscribed_message_cpu_s"] == pytest.approx(math.prod(vals) ** (1 / len(vals)))
    assert min(vals) <= out["oversubscribed_message_cpu_s"] <= max(vals)
    assert calibrate.measure_message_cpu(16, 1, tmp_path)["oversubscribed_message_cpu_s"] == 0.0


def test_steps_in_lockstep_give_the_shared_core_capacities():
    """A result with synchronized steps sets both capacities from them (the oversubscribed one
    never above the other: more is noise); without, the independent benchmarks' effective cores
    and no oversubscribed capacity."""
    r = fake_result("local")
    r["synchronized_steps"]["oversubscribed_capacity"] = calibrate.spread([1.95])
    assert calibrate.to_cluster(r).oversubscribed_core_capacity == pytest.approx(1.81)
    r["synchronized_steps"]["collective_wait_s"] = calibrate.spread([-0.2e-3, -0.1e-3])  # noise below 0: none
    assert calibrate.to_cluster(r).collective_wait_s == 0.0
    del r["synchronized_steps"]
    spec = calibrate.to_cluster(r)
    assert spec.shared_core_capacity == pytest.approx(1.9) and spec.oversubscribed_core_capacity is None
    assert spec.collective_wait_s == 0.0
    assert not any("lockstep" in line for line in calibrate.summary_lines(r))
    assert any("lockstep" in line and "2 processes 1.81" in line and "4 processes 1.70" in line
               for line in calibrate.summary_lines(fake_result()))
    assert any("collective_wait_s" in line and "1 ms" in line for line in calibrate.summary_lines(fake_result()))
    r = fake_result()  # against this core's own nominal peak too, where /proc/cpuinfo tells it
    assert "of this core's nominal" not in calibrate.summary_lines(r)[0]
    r["compute"]["this_cpu_peak_flops_per_s"] = 83.2e9
    assert "= 60.0% of the cpu-core peak, 114.8% of this core's nominal 83.2 GFLOP/s" in calibrate.summary_lines(r)[0]


def test_a_window_alone_is_timed_again_while_other_work_shares_the_machine():
    """timed_alone: a window whose machine carried more than ALONE_OTHER_CORES_MAX cores besides the
    process is timed again, up to ALONE_TRIES times, and the least disturbed one is kept; a quiet
    first window is kept at once. The summary warns when even the kept one was disturbed."""
    def run(loads):  # each window: 1 s of wall time, the process's core plus ``load`` others
        state = {"busy": 0.0, "t": 0.0, "k": 0}

        def window():
            load = loads[state["k"]]
            state["k"] += 1
            state["busy"] += 1.0 + load
            state["t"] += 1.0
            return 0.030 * (1 + load)  # other work slows the step

        step, other = calibrate.timed_alone(window, lambda: state["busy"], lambda: state["t"])
        return step, other, state["k"]

    assert run([0.05, 1.0, 1.0]) == (pytest.approx(0.0315), pytest.approx(0.05), 1)
    assert run([0.9, 0.1, 1.0]) == (pytest.approx(0.033), pytest.approx(0.1), 2)
    step, other, k = run([0.9, 0.6, 0.8])
    assert k == calibrate.ALONE_TRIES and other == pytest.approx(0.6) and step == pytest.approx(0.048)
    r = fake_result()
    assert not any("other work" in line for line in calibrate.summary_lines(r))
    r["synchronized_steps"]["alone_other_cores"] = 0.6
    assert any("warning: other work kept 0.60 cores busy" in line for line in calibrate.summary_lines(r))


@pytest.mark.slow
def test_training_steps_alone_in_lockstep_and_two_per_core_are_timed(tmp_path):
    """Real training steps of a zoo net: alone, one process per core with a barrier per step,
    then two per core; positive capacities (here about 1.7-1.9 cores' worth of 2)."""
    cfg = {**calibrate.synchronized_steps_config(["resnet_cifar"], quick=True), "window_s": 0.5}
    out = calibrate.measure_synchronized_steps(2, cfg, tmp_path)
    assert out["processes"] == [1, 2, 4] and set(out["per_net"]) == {"resnet_cifar"}
    assert 0 <= out["alone_other_cores"] < 1  # an otherwise idle machine
    for k in ("capacity", "oversubscribed_capacity"):
        assert len(out[k]["values"]) == cfg["repeats"] and all(0 < v < 4 for v in out[k]["values"])
    # SYNC_EXTRA_CALLS more small all-reduces a step, SYNC_WAIT_PAIRS times a repeat: differences of two step
    # times over the calls, noisy, but well under a step
    assert len(out["collective_wait_s"]["values"]) == cfg["repeats"] * calibrate.SYNC_WAIT_PAIRS
    assert all(abs(v) < 0.03 for v in out["collective_wait_s"]["values"])
    assert calibrate.measure_synchronized_steps(16, cfg, tmp_path) == {}  # many cores: not measured


def test_the_lower_of_two_whole_pass_timings_is_kept_per_batch():
    """Per batch, the timing whose forward + backward is lower, its forward and backward together."""
    a = {"net": "x", "phase": "net", "counts": {"k": 1}, "batches": [16, 64], "fwd_s": [1.0, 4.0], "bwd_s": [2.0, 8.0]}
    b = {**a, "fwd_s": [1.2, 3.0], "bwd_s": [1.0, 10.0]}  # batch 16: 2.2 < 3; batch 64: 13 > 12
    out = calibrate.lower_passes(a, b)
    assert out["fwd_s"] == [1.2, 4.0] and out["bwd_s"] == [1.0, 8.0]
    assert out["net"] == "x" and out["counts"] == {"k": 1} and out["batches"] == [16, 64]
    assert a["fwd_s"] == [1.0, 4.0]  # the inputs are left as they were


def test_fit_line_is_exact_on_a_line_and_never_negative():
    assert calibrate.fit_line([16, 64], [0.002 + 16e-4, 0.002 + 64e-4]) == pytest.approx((0.002, 1e-4))
    assert calibrate.fit_line([8, 16, 32], [3e-3, 3e-3, 3e-3]) == pytest.approx((3e-3, 0.0), abs=1e-12)
    fixed, per = calibrate.fit_line([16, 64], [2e-3, 1.9e-3])  # noise: a falling line is a flat one
    assert per == 0.0 and fixed == pytest.approx(1.95e-3)
    assert calibrate.fit_line([32], [6.4e-3]) == pytest.approx((0.0, 2e-4))


def _profile_row(key, fwd=(1e-3, 2e-5), bwd=(2e-3, 4e-5)):
    return {"key": key, "net": "n", "layer": "l", "batches": [16, 64], "fwd_s": [], "bwd_s": [],
            "fwd_fixed_s": fwd[0], "fwd_per_sample_s": fwd[1], "bwd_fixed_s": bwd[0], "bwd_per_sample_s": bwd[1]}


def test_the_engine_uses_a_profiled_layer_and_the_cluster_file_keeps_it(tmp_path):
    from layerplan.cost.compute import input_bytes, layer_time_s, profile_key
    from layerplan.netspec.load import resolve_model

    net, _ = resolve_model("debug")
    layer = next(lyr for lyr in net.layers if lyr.kind == "conv")
    key = profile_key(layer, input_bytes(net, layer))
    result = {**fake_result("local"), "profile": {"nets": ["debug"], "batches": [16, 64],
                                                  "layers": [_profile_row(key)]}}
    spec = calibrate.to_cluster(result, nodes=2)
    dev = spec.device
    assert layer_time_s(layer, dev, 10, direction="fwd", in_bytes=input_bytes(net, layer)) == pytest.approx(1e-3 + 10 * 2e-5)
    assert layer_time_s(layer, dev, 10, direction="bwd", in_bytes=input_bytes(net, layer)) == pytest.approx(2e-3 + 10 * 4e-5)
    plain = replace(dev, profiled_layers=())
    assert layer_time_s(layer, dev, 10, direction="fwd", in_bytes=input_bytes(net, layer), bytes_scale=0.5) == \
        layer_time_s(layer, plain, 10, direction="fwd", in_bytes=input_bytes(net, layer), bytes_scale=0.5)
    other = next(lyr for lyr in net.layers if lyr.kind == "fc")
    assert layer_time_s(other, dev, 10, direction="fwd", in_bytes=input_bytes(net, other)) == \
        layer_time_s(other, plain, 10, direction="fwd", in_bytes=input_bytes(net, other))
    for suffix in (".yaml", ".json"):
        path = tmp_path / f"c{suffix}"
        assert calibrate.save(result, path, nodes=2) == spec
        assert hardware.load_cluster(path) == spec
    bad = spec.to_dict()
    bad["device"]["profiled_layers"][0]["fwd_fixed_s"] = "fast"
    with pytest.raises(SpecError, match="fwd_fixed_s must be a number"):
        hardware.cluster_from_dict(bad)
    bad["device"]["profiled_layers"] = {"not": "a list"}
    with pytest.raises(SpecError, match="profiled_layers must be a list"):
        hardware.cluster_from_dict(bad)


def test_a_profiled_layer_goes_through_its_measured_batches_and_along_its_line_beyond():
    """Measured times at 16, 32 and 64 that are no line (a fully connected layer's backward): the
    engine takes them exactly at those batches, linearly between, and the fitted line outside; the
    points survive a cluster file."""
    p = hardware.ProfiledLayer(key="k", fwd_fixed_s=1e-3, fwd_per_sample_s=1e-4, bwd_fixed_s=0.045,
                               bwd_per_sample_s=7.8e-4, batches=(16, 32, 64), fwd_s=(2.6e-3, 4.2e-3, 7.4e-3),
                               bwd_s=(0.0646, 0.0806, 0.095))
    assert p.time_s(16, "bwd") == pytest.approx(0.0646) and p.time_s(64, "bwd") == pytest.approx(0.095)
    assert p.time_s(24, "bwd") == pytest.approx((0.0646 + 0.0806) / 2)
    assert p.time_s(48, "fwd") == pytest.approx((4.2e-3 + 7.4e-3) / 2)
    assert p.time_s(8, "bwd") == pytest.approx(0.045 + 8 * 7.8e-4)  # outside: the line
    assert p.time_s(128, "fwd") == pytest.approx(1e-3 + 128 * 1e-4)
    line = replace(p, fwd_s=(), bwd_s=())  # older cluster files: the line everywhere
    assert line.time_s(16, "bwd") == pytest.approx(0.045 + 16 * 7.8e-4)
    with pytest.raises(SpecError, match="one non-negative time per batch"):
        replace(p, bwd_s=(0.0646, 0.0806))
    with pytest.raises(SpecError, match="batches must be increasing"):
        replace(p, batches=(32, 16, 64))
    dev = replace(hardware.device("cpu-core"), profiled_layers=(p,))
    assert hardware.cluster_from_dict(replace(hardware.cluster("titan-x"), device=dev).to_dict()).device.profiled_layers == (p,)


def test_profiling_times_every_layer_the_engine_asks_for(tmp_path):
    """A real profile of the debug net: every module layer with one input is measured, under the key
    the engine looks up, at every batch."""
    from layerplan.cost.compute import input_bytes, profile_key
    from layerplan.netspec.load import resolve_model

    cfg = calibrate.profile_config(["debug"], (2, 8), quick=True, repeats=1)
    prof = calibrate.measure_profile(cfg, tmp_path)
    net, _ = resolve_model("debug")
    modules = [lyr for lyr in net.layers if lyr.op[:1].isupper() and len(lyr.parents) <= 1]
    keys = {profile_key(lyr, input_bytes(net, lyr)) for lyr in modules}
    assert keys and keys == {row["key"] for row in prof["layers"]}
    for row in prof["layers"]:
        assert row["batches"] == [2, 8] and all(t > 0 for t in row["fwd_s"])
    dev = replace(hardware.DEVICES["cpu-core"], profiled_layers=calibrate.profiled_layers(prof))
    assert all(dev.profiled(k) is not None for k in keys)
    # each phase's whole pass (the conv phase, the FC phase after the boundary), and the layer times scaled to it
    conv, fc = sorted(prof["whole"], key=lambda w: w["phase"])
    assert (conv["phase"], fc["phase"]) == ("conv", "fc") and conv["net"] == fc["net"] == "debug"
    assert set(conv["counts"]) | set(fc["counts"]) == keys and not set(conv["counts"]) & set(fc["counts"])
    fc_keys = {profile_key(lyr, input_bytes(net, lyr)) for lyr in net.fc_layers if lyr in modules}
    assert set(fc["counts"]) == fc_keys
    for whole in (conv, fc):
        assert whole["batches"] == [2, 8] and all(t > 0 for t in whole["fwd_s"] + whole["bwd_s"])
        for d in ("fwd", "bwd"):
            for i, b in enumerate(whole["batches"]):
                parts = sum(c * next(r for r in prof["layers"] if r["key"] == k)[f"{d}_s"][i]
                            for k, c in whole["counts"].items())
                assert parts == pytest.approx(whole[f"{d}_s"][i], rel=1e-9)


def test_layer_times_scale_to_their_nets_whole_pass():
    """Per net, direction and batch the layers' times are scaled so that they add up to the whole
    pass; a layer in two nets gets the mean of their factors."""
    rows = [{"key": "a", "batches": [4], "fwd_s": [1.0], "bwd_s": [2.0]},
            {"key": "b", "batches": [4], "fwd_s": [3.0], "bwd_s": [1.0]},
            {"key": "c", "batches": [4], "fwd_s": [5.0], "bwd_s": [5.0]}]
    nets = [{"net": "x", "counts": {"a": 2, "b": 1}, "batches": [4], "fwd_s": [10.0], "bwd_s": [5.0]},  # 5 → 10, 5 → 5
            {"net": "y", "counts": {"b": 1}, "batches": [4], "fwd_s": [3.0], "bwd_s": [3.0]}]  # 3 → 3, 1 → 3
    calibrate.scale_to_whole_pass(rows, nets)
    assert nets[0]["fwd_scale"] == [2.0] and nets[0]["bwd_scale"] == [1.0]
    assert nets[1]["fwd_scale"] == [1.0] and nets[1]["bwd_scale"] == [3.0]
    a, b, c = rows
    assert a["fwd_s"] == [2.0] and a["bwd_s"] == [2.0] and a["fwd_alone_s"] == [1.0]
    assert b["fwd_s"] == [pytest.approx(4.5)] and b["bwd_s"] == [pytest.approx(2.0)]  # means of 2, 1 and 1, 3
    assert c["fwd_s"] == [5.0] and "fwd_alone_s" not in c  # in no measured net: as timed


def test_the_whole_net_is_timed_at_its_net_batches_and_the_fc_phase_at_every_batch(tmp_path):
    """validate times the whole net at the batch its data workers run (profile_net_batches) and
    the FC phase at every batch; the conv layers at the other batches take the nearest factor."""
    cfg = calibrate.profile_config(["debug"], (2, 8), quick=True, repeats=1, net_batches=(2,))
    prof = calibrate.measure_profile(cfg, tmp_path)
    conv, fc = sorted(prof["whole"], key=lambda w: w["phase"])
    assert conv["batches"] == [2] and fc["batches"] == [2, 8]
    for row in prof["layers"]:
        assert row["batches"] == [2, 8]
        if row["key"] in conv["counts"] and "fwd_alone_s" in row:
            assert row["fwd_s"][1] / row["fwd_alone_s"][1] == pytest.approx(conv["fwd_scale"][0])
    with pytest.raises(ConfigError, match="must be among"):
        calibrate.profile_config(["debug"], (2, 8), net_batches=(4,))


def test_a_batch_without_its_nets_pass_takes_the_nearest_batchs_factor():
    rows = [{"key": "a", "batches": [4, 8, 64], "fwd_s": [1.0, 2.0, 16.0], "bwd_s": [1.0, 2.0, 16.0]}]
    nets = [{"net": "x", "counts": {"a": 1}, "batches": [4, 32], "fwd_s": [2.0, 24.0], "bwd_s": [1.0, 8.0]}]
    calibrate.scale_to_whole_pass(rows, nets)  # at 32 the layer was not timed: no factor there
    assert nets[0]["fwd_scale"] == [2.0, 1.0]
    assert rows[0]["fwd_s"] == [2.0, 4.0, 32.0]  # 8 and 64 take 4's factor


def test_bad_profile_arguments_exit_2(capsys):
    assert cli.main(["calibrate", "--profile", "no_such_net"]) == 2
    assert "zoo names" in capsys.readouterr().err
    assert cli.main(["calibrate", "--profile", "debug", "--profile-batches", "16,x"]) == 2
    assert "--profile-batches" in capsys.readouterr().err


def test_speed_probe_on_one_thread_and_on_loaded_cores():
    """FLOP/s of the probe's calls: the fastest on one thread; the median per thread with two at once."""
    import torch

    threads = torch.get_num_threads()
    one = calibrate.speed_probe(window_s=0.05)
    two = calibrate.speed_probe(window_s=0.05, threads=2)
    assert one > 0 and two > 0 and math.isfinite(one) and math.isfinite(two)
    assert torch.get_num_threads() == threads  # restored
    mem = calibrate.memory_probe(window_s=0.02)  # seconds of a memory-bound call, two threads at once
    assert 0 < mem < 1 and torch.get_num_threads() == threads


def test_fc_probe_times_a_large_fc_layers_pass_in_place_and_keeps_the_layers():
    """Seconds of an FC layer's forward, backward and SGD step at a small batch, two threads at
    once, each its own layer; the layers are built once per size, and the threads restored."""
    import torch

    threads = torch.get_num_threads()
    first = calibrate.fc_probe(window_s=0.02, features=256, batch=4)
    assert 0 < first < 1 and torch.get_num_threads() == threads
    kept = calibrate._FC_PROBE_CALLS[(256, 4)]
    assert len(kept) == 2 and 0 < calibrate.fc_probe(window_s=0.02, features=256, batch=4) < 1
    assert calibrate._FC_PROBE_CALLS[(256, 4)] is kept


def test_net_probe_times_the_nets_own_training_pass_and_keeps_the_net():
    """Seconds of a zoo net's cross-entropy forward and backward, two threads at once, the net built
    once: a second call reuses it."""
    import torch

    threads = torch.get_num_threads()
    first = calibrate.net_probe("debug", window_s=0.02, batch=4)
    assert 0 < first < 1 and torch.get_num_threads() == threads
    kept = calibrate._NET_PROBE_CALLS[("debug", 2, 4)]
    assert len(kept) == 2
    assert 0 < calibrate.net_probe("debug", window_s=0.02, batch=4) < 1
    assert calibrate._NET_PROBE_CALLS[("debug", 2, 4)] is kept


def test_an_emulated_calibration_keeps_the_links_measured_flow_lead():
    from layerplan.runtime import emulate

    r = fake_result("emulated")
    assert calibrate.to_cluster(r).nic.flow_lead_bytes == emulate.FLOW_LEAD_BYTES  # 2 hosts: nothing to fan out to
    assert calibrate.to_cluster(fake_result("local"), nodes=2).nic.flow_lead_bytes == 0.0  # loopback: none
    r["link"]["flow_lead"] = {"receivers": 3, "sizes_bytes": [1_000_000, 4_000_000],
                              "first_over_last": [[0.7, 0.6, 0.8], [0.9, 0.85, 0.88]], "flow_lead_bytes": 210e3}
    assert calibrate.to_cluster(r).nic.flow_lead_bytes == 210e3
    assert "3 flows leaving one host together: the first in at 0.70, 0.88 of the last's time for 1 MB, 4 MB each " \
           "(medians): flow_lead_bytes 210 kB" in calibrate.summary_lines(r)


def test_a_disturbed_section_is_told_by_its_spread_its_lockstep_capacity_or_the_steal():
    """disturbance: compute repeats spread over COMPUTE_SPREAD_MAX, a net's lockstep capacities
    spread over SYNC_SPREAD_MAX or read below SYNC_VS_SHARED_MIN of the independent processes'
    cores' worth, or the hypervisor's steal over STEAL_SHARE_MAX; steady figures are not."""
    s = calibrate.spread
    r = fake_result("local")
    assert calibrate.disturbance("compute", r["compute"], 0.0) is None
    assert calibrate.disturbance("compute", r["compute"], None) is None  # no steal figure: the spread decides
    assert "hypervisor gave 5.0%" in calibrate.disturbance("compute", r["compute"], 0.05)
    noisy = {**r["compute"], "per_thread_flops_per_s": s([24e9, 28e9, 27e9])}  # the disturbed calibration's 17.5%
    assert "one thread's FLOP/s spread" in calibrate.disturbance("compute", noisy, 0.0)
    sync = r["synchronized_steps"]
    assert calibrate.disturbance("synchronized_steps", sync, 0.0, 1.9) is None
    low = {**sync, "per_net": {"resnet_cifar": {**sync["per_net"]["resnet_cifar"], "capacity": s([1.59, 1.60])}}}
    assert calibrate.sync_disturbed_nets(low, 1.88).keys() == {"resnet_cifar"}
    assert "below 90% of the 1.88 of independent processes'" in calibrate.disturbance("synchronized_steps", low, 0.0, 1.88)
    assert calibrate.sync_disturbed_nets(low, None) == {}  # nothing to hold it against: the spread alone
    two = {**low, "per_net": {**low["per_net"], "alexnet_cifar": sync["per_net"]["resnet_cifar"]}}
    assert "below 90% of the 1.81 of alexnet_cifar's lockstep" in calibrate.sync_disturbed_nets(two, None)["resnet_cifar"]
    wide = {**sync, "per_net": {"resnet_cifar": {**sync["per_net"]["resnet_cifar"], "capacity": s([1.2, 1.9])}}}
    assert "capacity spread" in calibrate.disturbance("synchronized_steps", wide, None, None)
    assert calibrate.disturbance("link", r["link"], 0.0) is None  # a link's repeats spread widely when steady
    assert calibrate.disturbance("rounds", r["rounds"], 0.0) is None
    bimodal = {**r["rounds"], "round_s": {"2": s([1.754e-3, 0.249e-3, 1.371e-3]), "4": s([0.836e-3, 0.788e-3, 0.74e-3])}}
    why = calibrate.disturbance("rounds", bimodal, 0.0)
    assert "ring rounds with 2 ranks spread" in why and "with 4 ranks (788 µs) took less than with 2" in why


def test_merging_a_redone_net_keeps_the_steadier_reading_and_recomputes_the_totals():
    s = calibrate.spread
    first = {"processes": [1, 2, 4], "cores": 2, "batch": 16, "alone_other_cores": 0.1,
             "per_net": {"alexnet_cifar": {"capacity": s([1.2, 1.9]), "oversubscribed_capacity": s([1.5, 1.8])},
                         "resnet_cifar": {"capacity": s([1.85, 1.87]), "oversubscribed_capacity": s([1.8]),
                                          "collective_wait_s": s([2e-3])}},
             "capacity": s([1.2, 1.9, 1.85, 1.87]), "oversubscribed_capacity": s([1.5, 1.8, 1.8]),
             "collective_wait_s": s([2e-3])}
    again = {"alone_other_cores": 0.2, "per_net": {"alexnet_cifar": {
        "capacity": s([1.84, 1.86]), "oversubscribed_capacity": s([1.8, 1.82]), "collective_wait_s": s([9e-3])}}}
    merged = calibrate.merge_synchronized(first, again)
    assert merged["per_net"]["resnet_cifar"] == first["per_net"]["resnet_cifar"]
    assert merged["per_net"]["alexnet_cifar"]["capacity"]["values"] == [1.84, 1.86]
    assert "collective_wait_s" not in merged["per_net"]["alexnet_cifar"]  # timed on resnet_cifar in the first reading
    assert merged["capacity"]["values"] == [1.84, 1.86, 1.85, 1.87] and merged["collective_wait_s"]["values"] == [2e-3]
    assert merged["alone_other_cores"] == 0.2
    worse = {"per_net": {"alexnet_cifar": {"capacity": s([1.0, 1.9]), "oversubscribed_capacity": s([1.8])}}}
    assert calibrate.merge_synchronized(first, worse)["per_net"]["alexnet_cifar"] == first["per_net"]["alexnet_cifar"]


def test_calibrate_measures_a_disturbed_section_again_and_keeps_the_steady_reading(monkeypatch):
    """calibrate(): the compute section whose first reading spread 17% is measured once more and the
    steady second kept; the lockstep steps of the one disturbed net are measured again and merged;
    a section that stays disturbed is kept with a warning (still_disturbed, the summary)."""
    s = calibrate.spread
    r = fake_result("local")
    calls = {"compute": 0, "sync": [], "profile": 0}

    def compute(cfg, log_dir, advance, cores):
        calls["compute"] += 1
        c = dict(r["compute"])
        if calls["compute"] == 1:
            c["per_thread_flops_per_s"] = s([80e9, 95e9, 96e9])
        return c

    def sync(cores, cfg, log_dir, advance=None):
        calls["sync"].append(list(cfg["nets"]))
        steady = {"capacity": s([1.8, 1.82]), "oversubscribed_capacity": s([1.7])}
        per_net = {n: ({"capacity": s([1.3, 1.8]), "oversubscribed_capacity": s([1.7])}
                       if n == "alexnet_cifar" and len(calls["sync"]) == 1 else steady) for n in cfg["nets"]}
        return {"processes": [1, 2, 4], "cores": 2, "batch": 16, "alone_other_cores": 0.0, "per_net": per_net,
                "capacity": s([1.8]), "oversubscribed_capacity": s([1.7])}

    def rounds(cores, repeats, log_dir):
        return {k: v for k, v in r["rounds"].items() if k != "messages"}

    def profile(cfg, log_dir, advance=None):
        calls["profile"] += 1
        return {"nets": list(cfg["nets"]), "batches": list(cfg["batches"]), "layers": [], "whole": []}

    monkeypatch.setattr(calibrate, "_compute_section", compute)
    monkeypatch.setattr(calibrate, "_link_section", lambda *a, **k: r["link"])
    monkeypatch.setattr(calibrate, "measure_rounds", rounds)
    monkeypatch.setattr(calibrate, "measure_message_cpu", lambda *a: r["rounds"]["messages"])
    monkeypatch.setattr(calibrate, "measure_synchronized_steps", sync)
    monkeypatch.setattr(calibrate, "measure_profile", profile)
    monkeypatch.setattr(calibrate, "steal_s", lambda: None)
    # the cores' speed: steady but for the probe after the link's first reading (another tenant's episode)
    # and again twice before its second reading, which waits for them (STEADY_POLL_S)
    speeds = iter([29e9] * 4 + [14e9] * 3)
    monkeypatch.setattr(calibrate, "_prober", lambda *a: contextlib.nullcontext(lambda: next(speeds, 29e9)))
    sleeps = []
    monkeypatch.setattr(calibrate.time, "sleep", sleeps.append)
    out = calibrate.calibrate(quick=True, progress=False, profile=["alexnet_cifar"],
                              sync_nets=["alexnet_cifar", "resnet_cifar"])
    assert calls["compute"] == 2 and out["compute"]["per_thread_flops_per_s"]["spread"] < 0.05
    assert calls["sync"] == [["alexnet_cifar", "resnet_cifar"], ["alexnet_cifar"]]  # only the disturbed net again
    assert out["synchronized_steps"]["per_net"]["alexnet_cifar"]["capacity"]["values"] == [1.8, 1.82]
    assert calls["profile"] == 1
    st = out["steadiness"]
    assert st["compute"]["tries"] == 2 and "one thread's FLOP/s spread" in st["compute"]["disturbed"][0]
    assert st["compute"]["kept_disturbed"] is None and st["rounds"]["tries"] == 1
    assert st["link"]["tries"] == 2 and "the cores ran at 0.48× their best speed" in st["link"]["disturbed"][0]
    assert st["link"]["probe_flops_per_s"] == [14e9, 29e9] and st["link"]["kept_disturbed"] is None
    assert st["link"]["kept_probe_flops_per_s"] == 29e9  # the probe around the reading kept
    assert sleeps == [calibrate.STEADY_POLL_S] * 2
    assert calibrate.still_disturbed(out) == {}
    assert any(line.startswith("compute: measured 2 times") and "the steady reading kept" in line
               for line in calibrate.summary_lines(out))
    # a machine disturbed throughout: each section measured SECTION_TRIES times, the steadier kept, a warning
    readings = iter([[80e9, 95e9], [70e9, 95e9]])
    monkeypatch.setattr(calibrate, "_compute_section",
                        lambda *a: {**r["compute"], "per_thread_flops_per_s": s(next(readings))})
    out = calibrate.calibrate(quick=True, progress=False)
    assert out["steadiness"]["compute"]["tries"] == calibrate.SECTION_TRIES
    assert out["compute"]["per_thread_flops_per_s"]["values"] == [80e9, 95e9]  # the steadier (first) reading
    assert "compute" in calibrate.still_disturbed(out)
    assert any("warning: still disturbed" in line for line in calibrate.summary_lines(out))


def test_the_probe_process_reports_the_cores_speed_at_each_call(tmp_path):
    with calibrate._prober(tmp_path, 2) as probe:
        speeds = [probe(), probe()]
    assert all(1e8 < v < 1e13 for v in speeds)  # FLOP/s a thread: a real machine's


def faked_sections(monkeypatch, r: dict, compute) -> None:
    """``calibrate``'s sections answered from ``fake_result`` ``r`` (compute by ``compute``), no steal."""
    monkeypatch.setattr(calibrate, "_compute_section", compute)
    monkeypatch.setattr(calibrate, "_link_section", lambda *a, **k: r["link"])
    monkeypatch.setattr(calibrate, "measure_rounds", lambda *a: {k: v for k, v in r["rounds"].items() if k != "messages"})
    monkeypatch.setattr(calibrate, "measure_message_cpu", lambda *a: r["rounds"]["messages"])
    monkeypatch.setattr(calibrate, "measure_synchronized_steps", lambda *a, **k: r["synchronized_steps"])
    monkeypatch.setattr(calibrate, "steal_s", lambda: None)


def test_a_section_whose_probes_read_low_against_the_calibrations_best_is_measured_again_at_its_end(monkeypatch):
    """The probes around the compute section read 20 GFLOP/s a thread, the rest 29: the compute
    section, steady by its own spread and by the probes known then, is measured again once the
    calibration has seen the cores' best, and that reading kept."""
    r = fake_result("local")
    readings = iter([90e9, 95e9])

    def compute(cfg, log_dir, advance, cores):
        return {**r["compute"], "per_thread_flops_per_s": calibrate.spread([next(readings)] * 2)}

    faked_sections(monkeypatch, r, compute)
    speeds = iter([20e9, 20e9])
    monkeypatch.setattr(calibrate, "_prober", lambda *a: contextlib.nullcontext(lambda: next(speeds, 29e9)))
    out = calibrate.calibrate(quick=True, progress=False)
    st = out["steadiness"]["compute"]
    assert st["tries"] == 2 and st["probe_flops_per_s"] == [20e9, 29e9] and st["kept_disturbed"] is None
    assert st["kept_probe_flops_per_s"] == 29e9
    assert "the cores ran at 0.69× their best speed" in st["disturbed"][0]
    assert out["compute"]["per_thread_flops_per_s"]["median"] == 95e9
    assert out["steadiness"]["link"]["tries"] == 2  # it began on compute's last probe: again at once
    assert all(out["steadiness"][k]["tries"] == 1 for k in ("rounds", "messages", "synchronized_steps"))
    assert out["rounds"]["messages"] == r["rounds"]["messages"] and "again" not in out["durations_s"]


def test_oversubscribed_wait_takes_the_least_round_of_as_many_ranks_as_cores():
    """Other work only slows a round of one rank a core: its least repeat is its time; the
    oversubscribed round keeps its median (waiting for a core is what it measures)."""
    s = calibrate.spread
    bimodal = {"2": s([1.754e-3, 0.249e-3, 1.371e-3]), "4": s([0.836e-3, 0.788e-3, 0.74e-3])}
    assert calibrate.oversubscribed_wait(bimodal, 2) == pytest.approx(0.788e-3 - 0.249e-3)
    assert calibrate.oversubscribed_wait({"2": s([0.9e-3]), "4": s([0.7e-3])}, 2) == 0.0  # never negative
    assert calibrate.oversubscribed_wait({"2": s([0.2e-3])}, 2) == 0.0  # no oversubscribed count measured


def _children(pid: int) -> list[int]:
    """The PIDs whose parent is ``pid`` (from /proc)."""
    from pathlib import Path

    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.dist
def test_a_terminated_calibration_leaves_no_benchmark_process_and_no_file(tmp_path):
    """SIGTERM to `layerplan calibrate` while its benchmark processes run: it exits 143, saying
    so, with none of them left running and no cluster file written."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "c.yaml"
    p = subprocess.Popen([sys.executable, "-m", "layerplan", "calibrate", "--quick", "-o", str(out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, kids = time.monotonic() + 120, []
        while not kids and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.2)
            kids = _children(p.pid)
        assert kids, "calibrate started no benchmark process"
        time.sleep(1.0)  # the children under way
        kids = _children(p.pid)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 143
        assert "terminated" in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    time.sleep(0.5)
    assert [k for k in kids if _running(k)] == [] and not out.exists()


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_disturbed_section_is_not_measured_again_past_the_calibrations_time(monkeypatch):
    """again_within_s: where a reading again would end the calibration past it, the disturbed
    section stands as measured once, recorded ``out_of_time`` with its warning; within it, again."""
    r = fake_result("local")
    calls = []

    def compute(cfg, log_dir, advance, cores):
        calls.append(1)
        return {**r["compute"], "per_thread_flops_per_s": calibrate.spread([80e9, 95e9])}  # spread 17%: disturbed

    faked_sections(monkeypatch, r, compute)
    monkeypatch.setattr(calibrate, "_prober", lambda *a: contextlib.nullcontext(lambda: 29e9))
    out = calibrate.calibrate(quick=True, progress=False, again_within_s=0.0)
    st = out["steadiness"]["compute"]
    assert len(calls) == 1 and st["tries"] == 1 and st["out_of_time"] and st["kept_disturbed"]
    assert any(line.startswith("compute: disturbed by other work") and "for want of time" in line
               for line in calibrate.steadiness_lines(out))
    calls.clear()
    out = calibrate.calibrate(quick=True, progress=False, again_within_s=3600.0)
    assert len(calls) == calibrate.SECTION_TRIES and not out["steadiness"]["compute"]["out_of_time"]


def test_a_later_reading_merges_its_repeats_into_every_spread_and_recomputes_the_derived_figures():
    s = calibrate.spread
    first = {"where": "loopback", "sizes_bytes": [1, 2], "p2p_time_s_by_repeat": [[1.0, 2.0], [1.2, 2.2]],
             "p2p_time_s": [1.1, 2.1], "payload_bytes_per_s": s([3.4e9, 3.5e9]),
             "allreduce": {"3": {"bytes": 8, "time_s": s([0.019, 0.020])}}}
    later = {"where": "loopback", "sizes_bytes": [1, 2], "p2p_time_s_by_repeat": [[3.0, 4.0]],
             "p2p_time_s": [3.0, 4.0], "payload_bytes_per_s": s([2.6e9]),
             "allreduce": {"3": {"bytes": 8, "time_s": s([0.023])}}}
    out = calibrate.merge_link(first, later)
    assert out["payload_bytes_per_s"]["values"] == [3.4e9, 3.5e9, 2.6e9]
    assert out["payload_bytes_per_s"]["median"] == 3.4e9
    assert out["payload_bytes_per_s"]["spread"] == pytest.approx((3.5 - 2.6) / 3.4)  # the drift stated
    assert out["allreduce"]["3"]["time_s"]["values"] == [0.019, 0.020, 0.023] and out["allreduce"]["3"]["bytes"] == 8
    assert out["p2p_time_s"] == [1.2, 2.2] and len(out["p2p_time_s_by_repeat"]) == 3
    assert out["where"] == "loopback" and first["payload_bytes_per_s"]["values"] == [3.4e9, 3.5e9]  # first untouched
    rounds = calibrate.merge_rounds({"bytes": 4096, "round_s": {"2": s([0.2e-3]), "4": s([0.8e-3])}, "oversubscribed_wait_s": 0.6e-3},
                                    {"bytes": 4096, "round_s": {"2": s([0.15e-3]), "4": s([0.9e-3])}, "oversubscribed_wait_s": 0.75e-3}, 2)
    assert rounds["round_s"]["2"]["values"] == [0.2e-3, 0.15e-3]
    assert rounds["oversubscribed_wait_s"] == pytest.approx(0.85e-3 - 0.15e-3)  # the merged rounds' median less the least


def test_a_full_calibration_reads_the_link_and_rounds_again_at_its_end_and_a_quick_one_does_not(monkeypatch):
    r = fake_result("local")
    faked_sections(monkeypatch, r, lambda *a: r["compute"])
    reads = {"link": 0, "rounds": 0}
    payloads = iter([[3.4e9, 3.5e9], [2.6e9, 2.7e9]])

    def link(*a, **k):
        reads["link"] += 1
        return {**r["link"], "payload_bytes_per_s": calibrate.spread(next(payloads))}

    def rounds(*a):
        reads["rounds"] += 1
        return {k: v for k, v in r["rounds"].items() if k != "messages"}

    monkeypatch.setattr(calibrate, "_link_section", link)
    monkeypatch.setattr(calibrate, "measure_rounds", rounds)
    monkeypatch.setattr(calibrate, "_prober", lambda *a: contextlib.nullcontext(lambda: 29e9))
    out = calibrate.calibrate(quick=False, progress=False)
    assert reads == {"link": 2, "rounds": 2}
    assert out["link"]["payload_bytes_per_s"]["values"] == [3.4e9, 3.5e9, 2.6e9, 2.7e9]
    assert out["rounds"]["round_s"]["2"]["values"] == r["rounds"]["round_s"]["2"]["values"] * 2
    assert out["steadiness"]["link"]["later_reading_after_s"] >= 0 and out["steadiness"]["link"]["tries"] == 1
    assert "later_reading_after_s" not in out["steadiness"]["compute"]
    assert any(line.startswith("link and rounds read again") for line in calibrate.summary_lines(out))
    reads.update(link=0, rounds=0)
    payloads = iter([[3.4e9, 3.5e9]])
    out = calibrate.calibrate(quick=True, progress=False)
    assert reads == {"link": 1, "rounds": 1} and "later_reading_after_s" not in out["steadiness"]["link"]
    assert not any("read again" in line for line in calibrate.summary_lines(out))


def test_two_calibrations_agree_where_their_medians_lie_within_the_larger_stated_spread():
    a = fake_result("local")
    b = fake_result("local", payload=119.5e6 * 1.2)  # the link 20% faster: far beyond either run's 0.1% spread
    b["compute"]["per_thread_flops_per_s"] = calibrate.spread([95.4e9, 96.6e9])  # 0.5% apart, spread 1.3%
    b["machine"] = {**b["machine"], "when": "2026-01-01 00:10:00"}
    del b["rounds"]["round_s"]["4"]
    res = calibrate.compare(a, b)
    rows = {r["figure"]: r for r in res["rows"]}
    assert rows["compute.per_thread_flops_per_s"]["agree"] and rows["compute.per_thread_flops_per_s"]["overlap"]
    assert rows["compute.per_thread_flops_per_s"]["apart"] == pytest.approx(0.5e9 / 95.75e9)
    pay = rows["link.payload_bytes_per_s"]
    assert not pay["agree"] and not pay["overlap"] and pay["apart"] == pytest.approx(0.2 / 1.1, rel=1e-3)
    assert pay["stated_spread"] == pytest.approx(0.001, rel=1e-3)
    assert rows["synchronized_steps.per_net.resnet_cifar.capacity"]["agree"]  # nested figures are found by their path
    assert res["only_in_a"] == ["rounds.round_s.4"] and res["only_in_b"] == []
    assert res["figures"] == len(rows) and res["agree"] == sum(r["agree"] for r in rows.values())
    assert res["sections"]["link"]["figures"] - res["sections"]["link"]["agree"] == 1  # only the payload
    assert res["notes"] == []
    assert any("quick" in n for n in calibrate.compare(a, {**b, "quick": False})["notes"])
    # a figure measured once has no spread: it agrees only with the same value
    assert rows["compute.effective_cores"]["agree"] and rows["compute.effective_cores"]["apart"] == 0
    b["compute"]["effective_cores"] = calibrate.spread([1.91])
    assert not {r["figure"]: r for r in calibrate.compare(a, b)["rows"]}["compute.effective_cores"]["agree"]
    assert calibrate.format_figure("link.latency_s", 85e-6) == calibrate.units.format_seconds(85e-6)
    assert calibrate.format_figure("rounds.round_s.4", 1e-3) == calibrate.units.format_seconds(1e-3)  # by ranks
    assert calibrate.format_figure("rounds.messages.cpu_s_per_end", 1e-3) == calibrate.units.format_seconds(1e-3)
    assert calibrate.format_figure("compute.effective_cores", 1.9) == "1.9"


def test_calibrate_compare_reads_json_and_validate_folders_and_refuses_the_rest(tmp_path, capsys):
    a, b = fake_result("local"), fake_result("local", payload=150e6)
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "calibration.json").write_text(json.dumps(b))
    assert cli.main(["calibrate", "--compare", str(tmp_path / "a.json"), str(tmp_path / "run"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["figures"] > 10 and out["a"].endswith("a.json")
    assert [r["figure"] for r in out["rows"] if not r["agree"]] == ["link.payload_bytes_per_s"]
    assert cli.main(["calibrate", "--compare", str(tmp_path / "a.json"), str(tmp_path / "a.json")]) == 0
    text = capsys.readouterr().out
    assert f"{out['figures']} of {out['figures']} figures agree within their stated spread" in text
    calibrate.save(a, tmp_path / "a.yaml")
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    for bad in (["--compare", str(tmp_path / "a.yaml"), str(tmp_path / "a.json")],
                ["--compare", str(tmp_path / "missing.json"), str(tmp_path / "a.json")],
                ["--compare", str(tmp_path / "other.json"), str(tmp_path / "a.json")],
                ["--compare", str(tmp_path), str(tmp_path / "a.json")],
                ["--compare", str(tmp_path / "a.json"), str(tmp_path / "a.json"), "-o", str(tmp_path / "x.yaml")],
                ["--compare", str(tmp_path / "a.json"), str(tmp_path / "a.json"), "--quick"],
                ["--compare", str(tmp_path / "a.json"), str(tmp_path / "a.json"), "--repeats", "5"]):
        assert cli.main(["calibrate", *bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "x.yaml").exists()
