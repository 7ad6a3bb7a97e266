"""Peak device memory per role (PALEO §3.1.1 activations; Stanza §4.2 assignment under GPU memory):
exact figures for a small net worked out by hand, the infeasibility message, the CLI's one-line
error, and the planner / Stanza assignment leaving out configs that do not fit."""

import pytest

from conftest import chain, make_net
from layerplan import hardware, strategies
from layerplan.cli import main
from layerplan.cost import compute
from layerplan.errors import ConfigError
from layerplan.plan import assign, planner


def tiny_net():
    # bytes per layer (fp32): params · 4, out = values · 4
    #   c1  conv  100 params = 400 B   out 4·4·4 = 64 values = 256 B
    #   p1  pool                       out 4·2·2 = 16 values =  64 B
    #   flat other                     out 16 values         =  64 B   (the boundary)
    #   f1  fc    136 params = 544 B   out 8 values          =  32 B
    #   r1  act                        out 8 values          =  32 B
    #   f2  fc     18 params =  72 B   out 2 values          =   8 B
    # input 3·4·4 = 48 values = 192 B per sample
    # P = 1016 B, P_conv = 400 B, P_fc = 616 B; Σout = 456 B (conv 384, fc 72) per sample
    return make_net(chain(
        ("c1", "conv", 100, (4, 4, 4), 1000),
        ("p1", "pool", 0, (4, 2, 2), 0),
        ("flat", "other", 0, (16,), 0),
        ("f1", "fc", 136, (8,), 256),
        ("r1", "act", 0, (8,), 0),
        ("f2", "fc", 18, (2,), 32),
    ), name="tiny", input_shape=(3, 4, 4))


def cluster(nodes=8, memory_bytes=1e12):
    dev = hardware.DeviceSpec(name="tiny", peak_flops_per_s=1e12, mem_bandwidth_bytes_per_s=1e11,
                              memory_bytes=memory_bytes)
    return hardware.ClusterSpec(name="t", nodes=nodes, device=dev, nic=hardware.LINKS["10gbe"])


K = 4  # samples per worker


def mem(name, cfg, nodes=8, batch=K):
    s = strategies.get(name)
    return {r: m.to_dict() for r, m in strategies.memory(tiny_net(), cluster(nodes), name, s.Config(**cfg), batch).items()}


def parts(parameters=0, gradients=0, optimizer=0, activations=0, inputs=0, buffers=0, samples=0):
    d = {"parameters_bytes": parameters, "gradients_bytes": gradients, "optimizer_bytes": optimizer,
         "activations_bytes": activations, "inputs_bytes": inputs, "buffers_bytes": buffers, "samples": samples}
    d["total_bytes"] = parameters + gradients + optimizer + activations + inputs + buffers
    return d


def test_tiny_net_is_as_worked_out():
    net = tiny_net()
    assert net.boundary == "flat" and net.boundary_bytes == 64
    assert (net.param_bytes, net.conv_param_bytes, net.fc_param_bytes) == (1016, 400, 616)
    assert sum(x.out_bytes for x in net.layers) == 456


def test_ps_worker_and_server():
    m = mem("ps", dict(workers=3, servers=2))
    # worker: full replica, no momentum (the servers update); the flat gradient pushed + the pull buffer
    assert m["worker"] == parts(parameters=1016, gradients=1016, activations=456 * K, inputs=192 * K,
                                buffers=2 * 1016, samples=K)
    assert m["worker"]["total_bytes"] == 6656
    # server: shard 1016/2, its summed gradient, its momentum, one receive buffer per worker
    assert m["server"] == parts(parameters=508, gradients=508, optimizer=508, buffers=3 * 508)


def test_allreduce_worker_has_ddp_buckets():
    m = mem("allreduce", dict(workers=4))
    assert m["worker"] == parts(parameters=1016, gradients=1016, optimizer=1016, activations=456 * K, inputs=192 * K,
                                buffers=1016, samples=K)
    alone = mem("allreduce", dict(workers=1))  # nobody to all-reduce with: no buckets
    assert alone["worker"]["total_bytes"] == 6656 - 1016


def test_stanza_conv_and_fc_worker():
    m = mem("stanza", dict(conv_workers=3, fc_workers=1))
    # CONV worker: conv phase with momentum for K samples; received activation gradients (64·K) + flat conv gradient
    assert m["conv"] == parts(parameters=400, gradients=400, optimizer=400, activations=384 * K, inputs=192 * K,
                              buffers=64 * K + 400, samples=K)
    assert m["conv"]["total_bytes"] == 4160
    # FC worker: the concatenated batch of its 3 CONV workers (12 samples), the activations it received
    assert m["fc"] == parts(parameters=616, gradients=616, optimizer=616, activations=72 * 12, inputs=64 * 12, samples=12)
    assert m["fc"]["total_bytes"] == 3480
    two = mem("stanza", dict(conv_workers=3, fc_workers=2))  # ⌈3/2⌉·4 = 8 samples, + the FC all-reduce buffer
    assert two["fc"] == parts(parameters=616, gradients=616, optimizer=616, activations=72 * 8, inputs=64 * 8,
                              buffers=616, samples=8)


def test_ralp_worker_and_ps_worker():
    m = mem("ralp", dict(workers=3, split="flat"))
    act = 64 * K
    # worker: head without momentum; act grads received, flat head gradient pushed, head pulled
    assert m["worker"] == parts(parameters=400, gradients=400, activations=384 * K, inputs=192 * K,
                                buffers=act + 2 * 400, samples=K)
    # PS worker: tail with momentum for one worker's K samples, all 3 workers' activations received,
    # and the head's server (parameters, summed gradient, momentum, 3 receive buffers)
    assert m["ps"] == parts(parameters=616 + 400, gradients=616 + 400, optimizer=616 + 400, activations=72 * K,
                            inputs=3 * act, buffers=3 * 400, samples=K)
    assert m["ps"]["total_bytes"] == 5304


def test_groups_merged_fc():
    m = mem("groups", dict(machines=4, groups=2))
    act = 64 * K
    group = parts(parameters=400, gradients=400, activations=384 * K, inputs=192 * K, buffers=act, samples=K)
    assert m["group0"] == m["group1"] == group
    assert m["conv_model"] == parts(parameters=400, gradients=400, optimizer=400, buffers=4 * 400)
    # merged FC server: one group batch (k·B = 8) at a time, every group batch may wait (4 machines · B)
    assert m["fc"] == parts(parameters=616, gradients=616, optimizer=616, activations=72 * 8, inputs=4 * act, samples=8)


def test_hybrid_partitioned_and_replicated_fc():
    G, g_part = 4 * K, 8  # 4 CONV workers, 2 FC machines
    part = mem("hybrid", dict(conv_workers=4, fc_workers=2))
    assert part["conv"]["total_bytes"] == 4160
    # both blocks partitioned: half of (544 + 72) B; the whole batch's boundary activations;
    # f2's input all-gathered (r1: 32 B × G)
    assert part["fc"] == parts(parameters=308, gradients=308, optimizer=308, activations=72 * g_part, inputs=64 * G,
                               buffers=32 * G, samples=G)
    repl = mem("hybrid", dict(conv_workers=4, fc_workers=2, replicate=("f2",)))
    # f2 replicated: all of its 72 B, and its flat gradient all-reduced; no gather before it
    assert repl["fc"] == parts(parameters=272 + 72, gradients=272 + 72, optimizer=272 + 72, activations=72 * g_part,
                               inputs=64 * G, buffers=72, samples=G)


def test_peak_memory_bytes_agrees_with_training_memory():
    net = tiny_net()
    assert compute.peak_memory_bytes(net, net.fc_layers, K) == compute.training_memory(net, net.fc_layers, K).total_bytes


def test_prediction_carries_memory_per_role():
    net, c = tiny_net(), cluster(8)
    pred = strategies.predict(net, c, "stanza", strategies.get("stanza").Config(conv_workers=3, fc_workers=1), K)
    assert pred.memory_bytes_per_role == {"conv": 4160, "fc": 3480}
    d = pred.to_dict()
    assert d["memory_bytes_per_role"] == {"conv": 4160, "fc": 3480}
    assert d["memory_per_role"]["fc"]["samples"] == 12
    assert d["device_memory_bytes"] == c.device.memory_bytes
    assert d["step_time_s"] == pred.step_time_s > 0


def test_a_config_that_does_not_fit_says_which_role_needs_what():
    net, c = tiny_net(), cluster(8, memory_bytes=5000)
    cfg = strategies.get("stanza").Config(conv_workers=7, fc_workers=1)  # the FC worker keeps 28 samples
    with pytest.raises(ConfigError) as e:
        strategies.predict(net, c, "stanza", cfg, K)
    assert str(e.value) == ("stanza: an FC worker needs 5.52 KiB on a 4.88 KiB tiny (parameters 616 B, gradients 616 B, "
                            "momentum 616 B, activations 1.97 KiB for 28 samples, inputs 1.75 KiB)")
    assert strategies.memory_problem(net, c, "stanza", cfg, K) == str(e.value)
    # the same config is still predicted when asked not to check
    pred = strategies.predict(net, c, "stanza", cfg, K, check_memory=False)
    assert pred.memory_bytes_per_role["fc"] == 616 * 3 + 72 * 28 + 64 * 28 > c.device.memory_bytes
    ps = strategies.get("ps").Config(workers=3, servers=1)
    with pytest.raises(ConfigError, match=r"^ps: a worker needs 6.5 KiB on a 4.88 KiB tiny \("):
        strategies.predict(net, c, "ps", ps, K)


def test_stanza_assignment_skips_infeasible_fc_workers():
    net, c = tiny_net(), cluster(8, memory_bytes=5000)
    skipped = {}
    found = assign.stanza_assignment(net, c, K, skipped=skipped)
    assert sorted(a.config.fc_workers for a in found) == [2, 3, 4]  # n_f = 1: 28 samples on one FC worker
    assert list(skipped) == [1] and skipped[1].startswith("stanza: an FC worker needs 5.52 KiB")
    best = assign.best_stanza(net, c, K)
    assert best.fc_workers > 1
    assert strategies.get("stanza").default(net, c, K).fc_workers > 1
    with pytest.raises(ConfigError, match="a CONV worker needs .*no split of 8 nodes"):
        assign.best_stanza(net, cluster(8, memory_bytes=4000), K)


def test_planner_ranks_only_configs_that_fit():
    net, c = tiny_net(), cluster(8, memory_bytes=5000)
    ranked = planner.rank(net, c, K)
    assert ranked
    for r in ranked:
        assert max(r.prediction.memory_bytes_per_role.values()) <= c.device.memory_bytes
    names = {r.strategy for r in ranked}
    assert "ps" not in names and "allreduce" not in names  # a full replica needs 6.5 KiB
    assert "stanza" in names
    # the role that overflows the most is named: 7 workers' receive buffers on one server
    assert ranked.skipped["ps workers=7 servers=1"] == ("ps: a server needs 9.92 KiB on a 4.88 KiB tiny (parameters 1016 B, "
                                                        "gradients 1016 B, momentum 1016 B, buffers 6.95 KiB)")
    assert ranked.skipped["ps workers=1 servers=7"].startswith("ps: a worker needs 6.5 KiB on a 4.88 KiB tiny")
    assert ranked.skipped["stanza conv_workers=7 fc_workers=1"].startswith("stanza: an FC worker needs")
    # why_not, told the batch, finds the same reasons without simulating
    why = planner.why_not(net, c, batch=K)
    for key, reason in ranked.skipped.items():
        assert why[key] == reason
    assert planner.why_not(net, c) == {}  # without the batch: only strategies that do not apply
    with pytest.raises(ConfigError, match="no config fits: ps workers=7 servers=1: ps: a server needs"):
        planner.rank(net, cluster(8, memory_bytes=1000), K)


def test_plan_report_lists_skipped_configs(capsys):
    from layerplan import report

    net, c = tiny_net(), cluster(8, memory_bytes=5000)
    ranked = planner.rank(net, c, K)
    report.print_plan(net, c, K, ranked, planner.why_not(net, c), top=3)
    out = capsys.readouterr().out
    assert "ps: 7 configs skipped, e.g. workers=7 servers=1 — a server needs 9.92 KiB on a 4.88 KiB tiny" in out
    assert "stanza: conv_workers=7 fc_workers=1 skipped — an FC worker needs 5.52 KiB" in out
    doc = report.plan_dict(net, c, K, ranked, {}, top=3)
    assert doc["skipped"] == ranked.skipped


def test_cli_plan_prints_why_configs_were_skipped(tmp_path, capsys):
    spec = tmp_path / "tiny.json"
    tiny_net().save(spec)
    cl = tmp_path / "cluster.yaml"
    cl.write_text("name: t\nnodes: 8\ndevice: {name: tiny, peak_flops_per_s: 1TFLOPS, mem_bandwidth_bytes_per_s: 100GB/s, "
                  "memory_bytes: 5000}\nnic: 10gbe\n")
    assert main(["plan", str(spec), "--cluster", str(cl), "--batch-size", str(K)]) == 0
    out = capsys.readouterr().out
    assert "allreduce: 5 configs skipped" in out and "a worker needs 6.5 KiB" in out


def test_cli_predict_that_does_not_fit_is_one_line_exit_2(capsys):
    pytest.importorskip("torch")
    rc = main(["predict", "vgg16", "--strategy", "ps", "--device", "k20", "--batch-size", "512"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith("layerplan predict: error: ps: a worker needs 57.1 GiB on a 5 GiB k20 (")
    assert "activations 54.7 GiB for 512 samples" in err


@pytest.mark.parametrize("name", sorted(strategies.STRATEGIES))
def test_every_strategy_gives_memory_for_each_of_its_roles(name):
    net, c = tiny_net(), cluster(8)
    s = strategies.get(name)
    cfg = s.default(net, c, K)
    pred = strategies.predict(net, c, name, cfg, K)
    assert set(pred.memory_per_role) == set(pred.groups) == set(s.roles(cfg))
    assert all(m.total_bytes > 0 for m in pred.memory_per_role.values())
