"""Each strategy's schedule, run through the engine, against the papers' closed forms (under the
papers' assumptions: no latency, full link efficiency, free memory traffic)."""

import math
from dataclasses import replace

import pytest

from conftest import chain, make_net
from layerplan import hardware, strategies
from layerplan.cost.collectives import recursive_doubling_rounds
from layerplan.errors import ConfigError
from layerplan.plan import assign, omnivore, planner
from layerplan.strategies import groups
from layerplan.strategies.base import bwd_s, fwd_s, param_bytes

BW = 10e9 / 8


def ideal(nodes=8, shared_cores=None):
    dev = hardware.DeviceSpec(name="ideal", peak_flops_per_s=1e12, mem_bandwidth_bytes_per_s=1e18, memory_bytes=1e15,
                              compute_efficiency=1.0)
    nic = hardware.LinkSpec(name="ideal", bandwidth_bytes_per_s=BW, latency_s=0.0, efficiency=1.0)
    return hardware.ClusterSpec(name="ideal", nodes=nodes, device=dev, nic=nic, shared_cores=shared_cores)


def net_fc_heavy():
    return make_net(chain(
        ("c1", "conv", 30_000, (32, 16, 16), 40_000_000),
        ("p1", "pool", 0, (32, 8, 8), 0),
        ("c2", "conv", 200_000, (64, 8, 8), 60_000_000),
        ("p2", "pool", 0, (64, 4, 4), 0),
        ("flat", "other", 0, (1024,), 0),
        ("f1", "fc", 4_000_000, (4096,), 8_000_000),
        ("r1", "act", 0, (4096,), 0),
        ("f2", "fc", 400_000, (100,), 800_000),
    ), name="fcheavy")


def test_ps_is_stanza_eq6():
    net, c, b = net_fc_heavy(), ideal(8), 16
    for n_w, n_s in [(7, 1), (6, 2), (4, 4), (3, 1)]:
        pred = strategies.predict(net, c, "ps", strategies.get("ps").Config(workers=n_w, servers=n_s), b)
        t_ps = fwd_s(net, net.layers, c, b) + bwd_s(net, net.layers, c, b)
        expected = 2 * n_w * net.param_bytes / (n_s * BW) + t_ps  # Stanza eq.6
        # a server's NIC limits when n_w >= n_s; a worker's own NIC when n_s > n_w
        expected = max(expected, 2 * net.param_bytes / BW + t_ps)
        assert pred.step_time_s == pytest.approx(expected, rel=1e-6)
        assert pred.throughput_samples_per_s == pytest.approx(n_w * b / expected, rel=1e-6)  # Stanza eq.7


@pytest.mark.parametrize("n_c", range(2, 11))
def test_stanza_is_eq3(n_c):
    net, b = net_fc_heavy(), 8
    c = ideal(n_c + 1)
    pred = strategies.predict(net, c, "stanza", strategies.get("stanza").Config(conv_workers=n_c, fc_workers=1), b)
    t_c = fwd_s(net, net.conv_layers, c, b) + bwd_s(net, net.conv_layers, c, b)
    t_f = fwd_s(net, net.fc_layers, c, b) + bwd_s(net, net.fc_layers, c, b)
    a_k = net.boundary_bytes * b
    r = math.log2(n_c) if n_c & (n_c - 1) == 0 else math.floor(math.log2(n_c)) + 2
    expected = t_c + n_c * t_f + 2 * n_c * a_k / BW + param_bytes(net.conv_layers) * r / BW  # Stanza eq.3
    assert recursive_doubling_rounds(n_c) == r
    assert pred.step_time_s == pytest.approx(expected, rel=1e-6)
    assert assign.stanza_step_s(net, c, n_c, 1, b) == pytest.approx(expected, rel=1e-9)


def test_stanza_assignment_is_exhaustive_and_engine_confirmed():
    net, c, b = net_fc_heavy(), ideal(9), 8
    ranked = assign.stanza_assignment(net, c, b)
    assert [a.config.conv_workers + a.config.fc_workers for a in ranked] == [9] * 4
    best = assign.best_stanza(net, c, b)
    thr = strategies.predict(net, c, "stanza", best, b).throughput_samples_per_s
    for a in ranked[:3]:
        assert thr >= strategies.predict(net, c, "stanza", a.config, b).throughput_samples_per_s - 1e-9


def test_ring_allreduce_bytes_and_time():
    net, b = net_fc_heavy(), 8
    for w in (2, 4, 8):
        cfg = strategies.get("allreduce").Config(workers=w, algorithm="ring", bucket_bytes=0)
        pred = strategies.predict(net, ideal(w), "allreduce", cfg, b)
        s = net.param_bytes
        assert pred.total_bytes == pytest.approx(2 * s * (w - 1), rel=1e-9)  # RALP: Horovod moves 2·S·(W−1)
        t = fwd_s(net, net.layers, ideal(w), b) + bwd_s(net, net.layers, ideal(w), b)
        assert pred.step_time_s == pytest.approx(t + 2 * (w - 1) / w * s / BW, rel=1e-6)


def test_ddp_broadcasts_the_buffers_before_each_forward():
    """DDP's default broadcast_buffers: rank 0 sends its buffers (BatchNorm statistics) to every
    worker before the forward, which waits for them: (W − 1)·B more bytes and B/bandwidth more time."""
    net, b, w, buf = net_fc_heavy(), 8, 4, 40_000
    cfg = strategies.get("allreduce").Config(workers=w, algorithm="ring", bucket_bytes=0)
    plain = strategies.predict(net, ideal(w), "allreduce", cfg, b)
    with_bn = strategies.predict(replace(net, buffer_bytes=buf), ideal(w), "allreduce", cfg, b)
    assert with_bn.total_bytes == pytest.approx(plain.total_bytes + (w - 1) * buf, rel=1e-9)
    assert with_bn.step_time_s == pytest.approx(plain.step_time_s + (w - 1) * buf / BW, rel=1e-6)
    alone = strategies.get("allreduce").Config(workers=1)
    assert (strategies.predict(replace(net, buffer_bytes=buf), ideal(1), "allreduce", alone, b).step_time_s
            == strategies.predict(net, ideal(1), "allreduce", alone, b).step_time_s)  # nobody to send them to


def test_ddp_moves_every_gradient_through_its_bucket():
    """DDP's reducer copies each gradient into its bucket, the hook divides it by the workers and
    the reducer copies it back: 6·P bytes of memory traffic a step at the update's bandwidth (4·P
    with one worker: nothing to divide by), the copy back after the last all-reduce; Stanza's CONV
    workers sum (no division) and only run DDP with someone to all-reduce with."""
    from layerplan.strategies.base import copy_s

    net, b = net_fc_heavy(), 8
    bw = ideal(4).device.update_bytes_per_s(net.param_bytes)
    assert copy_s(1e6, ideal(4), passes=3, model_bytes=net.param_bytes) == pytest.approx(6e6 / bw)
    for w, passes in ((4, 3), (1, 2)):
        cfg = strategies.get("allreduce").Config(workers=w, bucket_bytes=0)
        graph = strategies.get("allreduce").schedule(net, ideal(w), cfg, b)
        tasks = {t.name: t for t in graph.tasks}
        copies = tasks["bwd0"].seconds - bwd_s(net, net.layers, ideal(w), b) + tasks["unbucket"].seconds
        assert copies == pytest.approx(2 * passes * net.param_bytes / bw)
        assert tasks["update"].deps == ("unbucket",)
    from layerplan.strategies.stanza import StanzaRunConfig  # the runtime's stanza: DDP's buckets

    stanza = strategies.get("stanza")
    p_c = sum(layer.param_bytes for layer in net.conv_layers)
    for n_c, copies in ((3, 4 * p_c / ideal(4).device.update_bytes_per_s(p_c)), (1, 0.0)):
        graph = stanza.schedule(net, ideal(4), StanzaRunConfig(conv_workers=n_c, fc_workers=1), b)
        tasks = {t.name: t for t in graph.tasks}
        bwd = sum(t.seconds for n, t in tasks.items() if n.startswith("conv_bwd"))
        unbucket = tasks["conv_unbucket"].seconds if "conv_unbucket" in tasks else 0.0
        assert bwd - bwd_s(net, net.conv_layers, ideal(4), b) + unbucket == pytest.approx(copies)


def test_ddp_broadcasts_each_dtype_of_buffers_as_one_call():
    """DDP coalesces the buffers of each dtype into one broadcast (BatchNorm: float statistics and
    int64 batch counters, two calls): the calls run one after another before the forward and each
    pays its latency; the bytes are those of one call of them all."""
    net, b, w = net_fc_heavy(), 8, 4
    c = replace(ideal(w), nic=replace(ideal(w).nic, latency_s=1e-3))
    cfg = strategies.get("allreduce").Config(workers=w, bucket_bytes=0)
    one = replace(net, buffer_bytes=40_000)
    two = replace(net, buffer_bytes=40_000, buffer_bytes_by_dtype=(39_000, 1_000))
    tasks = {t.name: t for t in strategies.get("allreduce").schedule(two, c, cfg, b).tasks}
    assert [tasks["buffers0"].bytes, tasks["buffers1"].bytes] == [39_000, 1_000]
    assert tasks["buffers1"].deps == ("buffers0",) and tasks["fwd"].deps == ("buffers1",)
    p1, p2 = (strategies.predict(n, c, "allreduce", cfg, b) for n in (one, two))
    assert p2.total_bytes == pytest.approx(p1.total_bytes)
    assert p2.step_time_s - p1.step_time_s == pytest.approx(1e-3, rel=1e-6)  # one more broadcast: one round


def test_ddp_runs_two_bucket_allreduces_at_once_on_gloo():
    """On CPUs (gloo: two threads per process group) a bucket's all-reduce starts when backward has
    produced it and one of the two threads is free; on GPUs (NCCL: one stream) one after another."""
    from layerplan.strategies.allreduce import buckets

    net, b, w = net_fc_heavy(), 8, 4
    cfg = strategies.get("allreduce").Config(workers=w, bucket_bytes=500_000)
    assert len(buckets(net, cfg.bucket_bytes)) >= 3
    cpu = replace(ideal(w), device=replace(ideal(w).device, kind="cpu"))
    gpu = replace(ideal(w), device=replace(ideal(w).device, kind="gpu"))
    deps = {k: {t.name: t.deps for t in strategies.get("allreduce").schedule(net, c, cfg, b).tasks}
            for k, c in (("cpu", cpu), ("gpu", gpu))}
    assert deps["cpu"]["allreduce1"] == ("bwd1",) and deps["cpu"]["allreduce2"] == ("bwd2", "allreduce0")
    assert deps["gpu"]["allreduce1"] == ("bwd1", "allreduce0") and deps["gpu"]["allreduce2"] == ("bwd2", "allreduce1")
    assert set(deps["cpu"]["unbucket"]) >= {f"allreduce{i}" for i in range(3)}
    t_cpu, t_gpu = (strategies.predict(net, c, "allreduce", cfg, b).step_time_s for c in (cpu, gpu))
    assert t_cpu <= t_gpu * (1 + 1e-9)


def test_ddp_buckets_overlap_backward():
    net, b = net_fc_heavy(), 8
    one = strategies.predict(net, ideal(4), "allreduce", strategies.get("allreduce").Config(workers=4, bucket_bytes=0), b)
    bucketed = strategies.predict(net, ideal(4), "allreduce", strategies.get("allreduce").Config(workers=4), b)
    assert bucketed.step_time_s < one.step_time_s


def test_ralp_moves_only_head_parameters_and_split_activations():
    net, c, b = net_fc_heavy(), ideal(5), 8
    cfg = strategies.get("ralp").default(net, c, b)
    assert cfg.workers == 4 and cfg.split == "p2"
    pred = strategies.predict(net, c, "ralp", cfg, b)
    head = param_bytes(net.head("p2"))
    act = net.layer("p2").out_bytes * b
    assert pred.bytes_sent_per_node["worker"] == pytest.approx(act + head)
    assert pred.bytes_sent_per_node["ps"] == pytest.approx(4 * (act + head))
    assert strategies.get("ralp").default(net, ideal(8), b, setting="H").workers == 4  # RALP-H: N/2 workers


@pytest.mark.parametrize("workers", [3, 20])
def test_ralp_serves_one_worker_at_a_time_and_returns_its_gradient_at_once(workers):
    """The PS worker runs the tail for one worker after another and sends each its activation
    gradient when served (runtime/roles/ralp.py): the first worker's head backward starts while the
    others still wait, the tail work adds up to n_w workers', and the step is one role "worker"."""
    from layerplan.strategies.ralp import WAVES

    net, b = net_fc_heavy(), 8
    c = ideal(workers + 1)
    cfg = strategies.get("ralp").Config(workers=workers, split="p2")
    pred = strategies.predict(net, c, "ralp", cfg, b)
    assert pred.groups == {"worker": workers, "ps": 1}
    assert set(pred.breakdown) == {"worker", "ps"} and all(e.group in ("worker", "ps") for e in pred.timeline)
    tail = net.tail("p2")
    t_tail = fwd_s(net, tail, c, b) + bwd_s(net, tail, c, b)
    served = [e for e in pred.timeline if e.name.startswith("tail_fwd_bwd")]
    assert len(served) == min(workers, WAVES)
    assert sum(e.end_s - e.start_s for e in served) == pytest.approx(workers * t_tail)
    first_bwd = min(e.start_s for e in pred.timeline if e.name.startswith("head_bwd"))
    assert first_bwd < max(e.end_s for e in served)  # overlaps the tail of the workers after it
    head = param_bytes(net.head("p2"))
    assert pred.bytes_sent_per_node["worker"] == pytest.approx(net.layer("p2").out_bytes * b + head)
    assert pred.bytes_per_link["worker->ps"] == pytest.approx(workers * (net.layer("p2").out_bytes * b + head))



def test_ralp_worker_whose_pull_comes_first_runs_its_head_but_is_served_after_every_pull():
    """Where the PS worker's pulls arrive one after another (LinkSpec.flow_lead_bytes), each worker
    starts its head forward on its own pull, but the PS worker serves the next step only once all
    its pulls are out (it waits for its sends, runtime/roles/ralp.py)."""
    net, b = net_fc_heavy(), 8
    even = ideal(5)
    lead = replace(even, nic=replace(even.nic, flow_lead_bytes=150e3))
    cfg = strategies.get("ralp").Config(workers=4, split="p2")
    pred = strategies.predict(net, lead, "ralp", cfg, b)
    assert pred.groups == {"worker": 4, "ps": 1}
    pulls = sorted(e.end_s for e in pred.timeline if e.name.startswith("it1/pull_head@") and e.group == "ps")
    assert len(pulls) == 4 and pulls[0] < pulls[-1]
    fwd = min(e.start_s for e in pred.timeline if e.name.startswith("it2/head_fwd@"))
    tail = min(e.start_s for e in pred.timeline if e.name.startswith("it2/tail_fwd_bwd@"))
    assert fwd == pytest.approx(pulls[0]) and tail >= pulls[-1]

def test_groups_async_beats_sync_when_the_fc_server_is_not_saturated():
    net, b = net_fc_heavy(), 8
    c = ideal(10)
    s = strategies.get("groups")
    thr = {g: strategies.predict(net, c, "groups", s.Config(machines=8, groups=g), b).throughput_samples_per_s
           for g in (1, 2, 4, 8)}
    assert thr[2] > thr[1]
    he = omnivore.group_times(net, c, b)
    g0 = omnivore.saturating_groups(he, 8, b)
    assert g0 in (1, 2, 4, 8)
    # beyond FC saturation more groups cannot help much (Omnivore §IV-B)
    assert thr[8] <= 1.25 * max(thr.values())


def test_groups_staggered_start_interleaves_pulls_with_pushes():
    """The conv model server starts the groups one pull apart (runtime/roles/groups.py): then one
    group's pull rides the server link's egress while another's push rides its ingress, and with
    the link the bottleneck each of g groups runs as if it were alone; in lockstep (a synchronous
    group of the same machines) the pulls and then the pushes share one direction."""
    net = make_net(chain(
        ("c1", "conv", 25_000_000, (16, 4, 4), 1_000_000),
        ("flat", "other", 0, (256,), 0),
        ("f1", "fc", 2_570, (10,), 5_000),
    ), name="convparams")
    c, b, s = ideal(4), 8, strategies.get("groups")
    two = strategies.predict(net, c, "groups", s.Config(machines=2, groups=2), b)
    alone = strategies.predict(net, ideal(3), "groups", s.Config(machines=1, groups=1), b)
    sync = strategies.predict(net, c, "groups", s.Config(machines=2, groups=1), b)
    t_link = param_bytes(net.conv_layers) / BW
    assert alone.step_time_s > 2 * t_link
    assert two.step_time_s == pytest.approx(alone.step_time_s, rel=1e-6)
    assert sync.step_time_s > two.step_time_s + 1.9 * t_link  # the pulls, then the pushes, two at a time


def test_groups_conv_model_server_moves_one_pull_and_one_push_at_a_time():
    """As the runtime does (runtime/roles/groups.py): with 4 groups whose transfers dominate, no two
    groups' pulls overlap on the conv model server's link, nor two pushes; each goes at the full
    rate, so one round of 4 groups takes 4 pulls' time on the egress (pushes ride the ingress)."""
    net = make_net(chain(
        ("c1", "conv", 25_000_000, (16, 4, 4), 1_000_000),
        ("flat", "other", 0, (256,), 0),
        ("f1", "fc", 2_570, (10,), 5_000),
    ), name="convparams")
    s = strategies.get("groups")
    pred = strategies.predict(net, ideal(6), "groups", s.Config(machines=4, groups=4), 8)
    t_link = param_bytes(net.conv_layers) / BW
    for kind in ("pull", "push"):
        iv = sorted((e.start_s, e.end_s) for e in pred.timeline
                    if e.group == "conv_model" and e.name.split("/")[-1].startswith(kind))
        assert len(iv) > 8
        assert all(b0 >= a1 - 1e-9 for (_, a1), (b0, _) in zip(iv, iv[1:]))  # one at a time
        assert all(b - a == pytest.approx(t_link, rel=1e-6) for a, b in iv)  # each at the full rate
    # 4 pulls' time a round: the engine simulates rounds after the measured ones (TAIL_ITERATIONS),
    # so the last measured round's pull still queues behind the next round's as in a long run
    # (without them it drained a pull early: 3.08 s against 3.28 s measured, 4 groups at 100 Mbit/s)
    assert pred.step_time_s == pytest.approx(4 * t_link, rel=1e-6)
    assert {int(e.name.split("/")[0][2:]) for e in pred.timeline} == set(range(pred.iterations))  # the tail not shown


def test_groups_fc_server_sends_the_gradients_before_its_update():
    """The merged FC server sends a group batch's activation gradients, then takes its SGD step
    (runtime/roles/groups.py): the gradients leave at the end of the FC pass, and the step follows
    on the server before the next group batch."""
    net = make_net(chain(
        ("c1", "conv", 10_000, (16, 4, 4), 1_000_000),
        ("flat", "other", 0, (256,), 0),
        ("f1", "fc", 20_000_000, (10,), 50_000_000),
    ), name="fcparams")
    s = strategies.get("groups")
    pred = strategies.predict(net, ideal(6), "groups", s.Config(machines=4, groups=2), 8)
    at = {e.name: (e.start_s, e.end_s) for e in pred.timeline if e.group in ("fc", "group0")}
    for i in range(pred.iterations):
        fc, upd, grad = at[f"it{i}/fc0"], at[f"it{i}/fc_update0"], at[f"it{i}/grad0"]
        assert grad[0] == pytest.approx(fc[1]) and upd[0] == pytest.approx(fc[1])
    # the server's next batch waits for the step
    starts = sorted((t0, n) for n, (t0, _) in at.items() if "/fc" in n)
    assert all("update" in b for (_, a), (_, b) in zip(starts, starts[1:]) if "update" not in a)


def test_groups_out_of_phase_compute_meets_the_mean_load():
    """Three or more asynchronous groups are simulated with the mean field on shared cores
    (StepGraph.mean_field_cores): synchronous groups (g = 1) are not, nor two groups, which the
    servers' queues hold in turn."""
    net = make_net(chain(
        ("c1", "conv", 10_000, (16, 4, 4), 20_000_000),
        ("flat", "other", 0, (256,), 0),
        ("f1", "fc", 20_000, (10,), 5_000_000),
    ), name="convheavy")
    s = strategies.get("groups")
    c = ideal(6, shared_cores=2)
    for g, expected in ((1, False), (2, False), (4, True)):
        graph = s.schedule(net, c, s.Config(machines=4, groups=g), 8)
        assert graph.mean_field_cores is expected
        # and their stages' spread is drawn (StepGraph.spread), over enough rounds to average it out
        assert graph.spread == (groups.SPREAD if expected else 0.0)
        assert graph.spread_iterations == (max(groups.ROUNDS, groups.SPREAD_BATCHES // g) if expected else 0)
    # the spread was measured on shared cores, where the threads' contention varies: not drawn elsewhere
    assert s.schedule(net, ideal(6), s.Config(machines=4, groups=4), 8).spread == 0.0


def test_hybrid_partition_vs_replicate_output_layer():
    # a huge output layer (Yan's 22K classes): replicating it moves its weights, partitioning moves activations
    net = make_net(chain(("c1", "conv", 10_000, (16, 8, 8), 10_000_000), ("flat", "other", 0, (1024,), 0),
                         ("f1", "fc", 1_000_000, (1024,), 2_000_000), ("f2", "fc", 22_000_000, (22_000,), 44_000_000)))
    c, b, s = ideal(8), 8, strategies.get("hybrid")
    part = strategies.predict(net, c, "hybrid", s.Config(conv_workers=4, fc_workers=4), b)
    repl = strategies.predict(net, c, "hybrid", s.Config(conv_workers=4, fc_workers=4, replicate=("f2",)), b)
    assert part.step_time_s < repl.step_time_s
    assert repl.bytes_sent_per_node["fc"] > part.bytes_sent_per_node["fc"]


def test_hybrid_single_fc_layer_after_a_dropout_transposes_the_logits():
    # the dropout before the only fc layer joins its block; the logits are still that fc layer's output
    net = make_net(chain(("c1", "conv", 1_000, (16, 4, 4), 1_000_000), ("flat", "other", 0, (256,), 0),
                         ("d1", "dropout", 0, (256,), 0), ("f1", "fc", 257 * 100, (100,), 51_200)))
    n_c, n_f, b = 2, 2, 8
    s = strategies.get("hybrid")
    pred = strategies.predict(net, ideal(4), "hybrid", s.Config(conv_workers=n_c, fc_workers=n_f), b)
    g = n_c * b
    back = n_c * b * 256 * 4  # partial input gradients to every CONV worker
    transpose = 2 * (n_f - 1) * 100 * 4 * g / n_f ** 2  # logits to rows and back
    assert pred.payload_sent_per_node["fc"] == pytest.approx(back + transpose)


def test_hybrid_layer_choices_follow_yan():
    from layerplan.strategies.hybrid import layer_choices

    net = make_net(chain(("c1", "conv", 10_000, (16, 8, 8), 10_000_000), ("flat", "other", 0, (1024,), 0),
                         ("f1", "fc", 1_000_000, (1024,), 2_000_000), ("f2", "fc", 22_000_000, (22_000,), 44_000_000)))
    cfg = strategies.get("hybrid").Config(conv_workers=4, fc_workers=4, replicate=("f1",))
    c1, c2 = layer_choices(net, cfg, 8)
    g = 32
    # partitioned: 3/4 of the input of the global batch is remote (Yan eq.6); replicated: ring 2·3/4·W
    assert c1.activation_bytes == pytest.approx(0.75 * 1024 * 4 * g) and c1.weight_bytes == pytest.approx(1.5 * 4e6)
    assert (c1.choice, c1.cheaper) == ("replicated", "partitioned") and "though partitioned would move less" in c1.reason
    assert (c2.choice, c2.cheaper) == ("partitioned", "partitioned") and c2.reason.startswith("partitioned: moves")


def test_shared_cores_slow_compute():
    net, b = net_fc_heavy(), 8
    cfg = strategies.get("allreduce").Config(workers=4)
    free = strategies.predict(net, ideal(4), "allreduce", cfg, b)
    shared = strategies.predict(net, ideal(4, shared_cores=2), "allreduce", cfg, b)
    assert shared.breakdown["worker"]["compute_s"] == pytest.approx(2 * free.breakdown["worker"]["compute_s"], rel=0.05)


def test_scale_gives_every_strategy_its_nodes_and_compares_them(capsys):
    """`scale` puts each strategy on the nodes it needs for w workers (ps: + servers, stanza and
    hybrid: + FC machines, ralp: + the PS worker, groups: + the FC and conv model servers), so
    hybrid and groups compare with pure data parallelism at every w."""
    import json

    from layerplan import cli
    from layerplan.plan import scaling

    net = net_fc_heavy()
    names = ("ps", "allreduce", "stanza", "ralp", "hybrid", "groups")
    got = {c.strategy: c for c in scaling.curves(net, ideal(2), names, (2, 4), 8)}
    extra = {"ps": 1, "allreduce": 0, "stanza": 1, "ralp": 1, "hybrid": 1, "groups": 2}
    for name in names:
        assert not got[name].skipped, (name, got[name].skipped)
        assert [(p.workers, p.nodes) for p in got[name].points] == [(w, w + extra[name]) for w in (2, 4)]
        assert all(p.throughput_samples_per_s > 0 for p in got[name].points)
    assert cli.main(["scale", "alexnet_cifar", "--strategy", "allreduce,hybrid", "--workers", "2,4,2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)  # a repeated count is one point
    assert [p["nodes"] for p in doc["hybrid"]["points"]] == [3, 5] and not doc["hybrid"]["skipped"]


def test_strategies_without_fc_phase_say_why():
    net = make_net(chain(("c1", "conv", 100, (4, 4, 4), 1000), ("c2", "conv", 100, (4, 1, 1), 1000)))
    for name in ("stanza", "ralp", "groups", "hybrid"):
        why = strategies.get(name).applies(net)
        assert why and "FC phase" in why
        with pytest.raises(ConfigError, match="FC phase"):
            strategies.get(name).default(net, ideal(4), 8)
    assert set(planner.why_not(net, ideal(4))) == {"stanza", "ralp", "groups", "hybrid"}
    assert {r.strategy for r in planner.rank(net, ideal(4), 8)} == {"ps", "allreduce"}


@pytest.mark.parametrize("name,cfg,match", [
    ("ps", dict(workers=8, servers=1), "need 9 nodes"),
    ("ps", dict(workers=4, servers=0), "servers"),
    ("allreduce", dict(workers=9), "need 9 nodes"),
    ("allreduce", dict(workers=4, algorithm="gossip"), "unknown algorithm"),
    ("stanza", dict(conv_workers=2, fc_workers=3), "idle"),
    ("ralp", dict(workers=4, split="c1"), "between two conv"),
    ("ralp", dict(workers=4, split="f2"), "nothing to run"),
    ("groups", dict(machines=6, groups=4), "do not divide"),
    ("hybrid", dict(conv_workers=4, fc_workers=2, replicate=("c1",)), "not an fc layer"),
])
def test_impossible_configs_say_why(name, cfg, match):
    s = strategies.get(name)
    with pytest.raises(ConfigError, match=match):
        strategies.predict(net_fc_heavy(), ideal(8), name, s.Config(**cfg), 8)


def test_every_strategy_predicts_and_plans_rank_best_first():
    net, c, b = net_fc_heavy(), ideal(8), 8
    ranked = planner.rank(net, c, b)
    assert {r.strategy for r in ranked} == set(strategies.STRATEGIES)
    thr = [r.throughput for r in ranked]
    assert thr == sorted(thr, reverse=True)
    for r in ranked:
        assert r.prediction.step_time_s > 0 and r.prediction.bottleneck


def test_plan_file_round_trip_and_strictness(tmp_path):
    net, c, b = net_fc_heavy(), ideal(8), 8
    best = planner.rank(net, c, b)[0]
    p = planner.make_plan("fcheavy.json", None, None, b, c, best)
    path = tmp_path / "plan.json"
    p.save(path)
    again = planner.Plan.load(path)
    assert again == p
    assert again.cluster_spec() == c
    assert again.strategy_config() == best.config
    text = path.read_text().replace('"format": 1', '"format": 1, "colour": 2')
    path.write_text(text)
    with pytest.raises(Exception, match="unknown key"):
        planner.Plan.load(path)


def _zoo_names():
    torch = pytest.importorskip("torch")  # noqa: F841  (the zoo is analysed with torch)
    from layerplan.netspec.zoo import ZOO

    return list(ZOO)


@pytest.mark.parametrize("model", _zoo_names())
def test_every_zoo_model_and_strategy_answers_or_says_why(model):
    """predict for every strategy's default config and plan on a preset cluster: a Prediction, or a
    ConfigError whose message names the reason (no FC phase, no split, does not fit ...)."""
    from layerplan.netspec.load import resolve_model

    net, _ = resolve_model(model)
    cluster = hardware.resolve_cluster("titan-x", nodes=8)
    for name, s in strategies.STRATEGIES.items():
        try:
            cfg = s.default(net, cluster, 16)
            pred = strategies.predict(net, cluster, name, cfg, 16)
        except ConfigError as e:
            assert str(e).strip() and "\n" not in str(e), (model, name)
            continue
        assert pred.step_time_s > 0 and math.isfinite(pred.step_time_s), (model, name)
    ranked = planner.rank(net, cluster, 16)
    assert ranked and ranked[0].throughput >= ranked[-1].throughput
    assert set(planner.why_not(net, cluster)) | {r.strategy for r in ranked} == set(strategies.STRATEGIES)


def test_stanza_overlapped_allreduce_hides_backward_and_moves_the_same_bytes():
    """StanzaRunConfig.bucket_bytes > 0 (DDP's buckets): the conv all-reduce starts during the conv
    backward, so the step shrinks by at most the conv backward time; bytes per step are unchanged."""
    pytest.importorskip("torch")  # the zoo is analysed with torch
    from layerplan.netspec.load import resolve_model
    from layerplan.strategies.stanza import StanzaRunConfig

    net, _ = resolve_model("vgg16_cifar")
    cluster = hardware.resolve_cluster("local-cpu", nodes=5, bandwidth="100Mbit")
    after = strategies.predict(net, cluster, "stanza", StanzaRunConfig(conv_workers=4, bucket_bytes=0), 16)
    during = strategies.predict(net, cluster, "stanza", StanzaRunConfig(conv_workers=4), 16)
    t_bwd = bwd_s(net, net.conv_layers, cluster, 16)
    assert during.step_time_s < after.step_time_s
    assert after.step_time_s - during.step_time_s <= t_bwd * (1 + 1e-9)
    assert during.total_bytes == pytest.approx(after.total_bytes)
    assert during.payload_sent_per_node == pytest.approx(after.payload_sent_per_node)


def test_ps_worker_whose_pull_leads_starts_its_next_step_early():
    """Where TCP gives a server's pulls uneven shares (LinkSpec.flow_lead_bytes), they arrive one
    after another (LinkSpec.stagger_shares) and each worker computes and pushes while the later ones
    still receive: the step is shorter than with even shares, the bytes are the same, and the
    workers are still the one role "worker"."""
    net, b = net_fc_heavy(), 8
    even = ideal(5)
    lead = replace(even, nic=replace(even.nic, flow_lead_bytes=150e3))
    cfg = strategies.get("ps").Config(workers=4, servers=1)
    p_even = strategies.predict(net, even, "ps", cfg, b)
    p_lead = strategies.predict(net, lead, "ps", cfg, b)
    assert p_lead.step_time_s < p_even.step_time_s
    assert p_lead.groups == {"worker": 4, "server": 1} and set(p_lead.breakdown) == {"worker", "server"}
    assert p_lead.bytes_sent_per_node == pytest.approx(p_even.bytes_sent_per_node)
    pulls = [e for e in p_lead.timeline if e.name.startswith("it0/pull@") and e.group == "worker"]
    assert len(pulls) == 4 and all(a.end_s < b.end_s for a, b in zip(pulls, pulls[1:]))  # one after another
    fwd = {e.name.split("@")[1]: e.start_s for e in p_lead.timeline if e.name.startswith("it1/fwd_bwd@")}
    assert all(fwd[p.name.split("@")[1]] == pytest.approx(p.end_s) for p in pulls)  # each starts on its own pull
    # the lead fades with the flow's size: a net of 100x the parameters barely gains
    big = make_net(chain(("c1", "conv", 30_000, (32, 16, 16), 40_000_000), ("flat", "other", 0, (8192,), 0),
                         ("f1", "fc", 400_000_000, (4096,), 8_000_000)), name="big")
    gain = 1 - strategies.predict(big, lead, "ps", cfg, b).step_time_s / strategies.predict(big, even, "ps", cfg, b).step_time_s
    assert 0 < gain < 0.01


def test_one_omnivore_group_whose_pull_leads_starts_its_forward_early():
    """With one group, the conv model server's pulls leave its NIC together: where TCP shares it
    unevenly, they arrive one after another and each machine starts its forward pass while the later
    ones still receive (as a PS's workers).
    The step is no longer, the bytes are the same and the machines are still the one role group0;
    with more groups (one group's pull at a time) nothing is split."""
    net, b = net_fc_heavy(), 8
    even = ideal(6)
    lead = replace(even, nic=replace(even.nic, flow_lead_bytes=150e3))
    one = strategies.get("groups").Config(machines=4, groups=1)
    p_even, p_lead = (strategies.predict(net, c, "groups", one, b) for c in (even, lead))
    assert p_lead.step_time_s <= p_even.step_time_s
    assert p_lead.groups == p_even.groups and p_lead.groups["group0"] == 4
    assert p_lead.bytes_sent_per_node == pytest.approx(p_even.bytes_sent_per_node)
    pulls = [e for e in p_lead.timeline if e.name.startswith("it0/pull0") and e.group == "group0"]
    assert len(pulls) == 4 and all(a.end_s < b.end_s for a, b in zip(pulls, pulls[1:]))  # one after another
    two = strategies.get("groups").Config(machines=4, groups=2)
    assert strategies.predict(net, lead, "groups", two, b).groups == strategies.predict(net, even, "groups", two, b).groups


def test_hybrid_partitioned_block_takes_its_slice_of_the_whole_layer():
    """A partitioned fc layer holds 1/n_f of the weights and computes its features for the global
    batch: 1/n_f of the whole layer's time for G samples — with a profile's fixed (per-weights) term,
    not the whole layer's time for G/n_f samples. A replicated one runs the whole layer for its G/n_f."""
    from layerplan.cost import compute

    net, n_c, n_f, b = net_fc_heavy(), 2, 2, 8
    f1 = net.layer("f1")
    prof = hardware.ProfiledLayer(key=compute.profile_key(f1, net.layer("flat").out_bytes), fwd_fixed_s=0.01,
                                  fwd_per_sample_s=0.001, bwd_fixed_s=0.03, bwd_per_sample_s=0.002)
    c = ideal(4)
    c = replace(c, device=replace(c.device, profiled_layers=(prof,)))
    s = strategies.get("hybrid")
    layers = [f1, net.layer("r1")]
    g = n_c * b

    def took(pred, name):
        return next(e.end_s - e.start_s for e in pred.timeline if e.name == name and e.group == "fc")

    part = strategies.predict(net, c, "hybrid", s.Config(conv_workers=n_c, fc_workers=n_f), b)
    assert took(part, "fwd_f1") == pytest.approx(fwd_s(net, layers, c, g) / n_f)
    assert took(part, "bwd_f1") == pytest.approx(bwd_s(net, layers, c, g) / n_f)
    assert fwd_s(net, layers, c, g) / n_f < fwd_s(net, layers, c, g // n_f)  # the fixed term is split too
    repl = strategies.predict(net, c, "hybrid", s.Config(conv_workers=n_c, fc_workers=n_f, replicate=("f1",)), b)
    assert took(repl, "fwd_f1") == pytest.approx(fwd_s(net, layers, c, g // n_f))


def test_workers_that_move_flat_gradients_are_charged_their_copies():
    """A worker that pushes or all-reduces its gradient as one flat vector gathers it first, and
    one that pulls its parameters copies them into its model (runtime/roles: ``flat_grads``,
    ``set_params``): one copy each (a read and a write) at the update's bandwidth; a flat gradient
    reduced becomes the gradients as views of it (``set_grads``), no copy."""
    from layerplan.strategies.base import copy_s

    net, b, c = net_fc_heavy(), 8, ideal(8)
    bw = c.device.update_bytes_per_s(net.param_bytes)
    assert copy_s(1e6, c, passes=2, model_bytes=net.param_bytes) == pytest.approx(4e6 / bw)
    assert copy_s(0, c) == 0.0
    p_c, p_f = param_bytes(net.conv_layers), param_bytes(net.fc_layers)

    def tasks(name, cfg):
        return {t.name: t for t in strategies.get(name).schedule(net, c, cfg, b).tasks}

    ps = tasks("ps", strategies.get("ps").Config(workers=2, servers=1))
    worker = [t for n, t in ps.items() if n.startswith("fwd_bwd")]
    sets = [t for n, t in ps.items() if n.startswith("set_params")]
    assert worker and len(sets) == len(worker)
    assert worker[0].seconds == pytest.approx(fwd_s(net, net.layers, c, b) + bwd_s(net, net.layers, c, b) + copy_s(net.param_bytes, c))
    assert all(t.seconds == pytest.approx(copy_s(net.param_bytes, c)) and t.deps[0].startswith("pull") for t in sets)

    hybrid = strategies.get("hybrid")
    for n_c, copied in ((3, copy_s(p_c, c)), (1, 0.0)):
        t = tasks("hybrid", hybrid.Config(conv_workers=n_c, fc_workers=1))
        assert t["conv_bwd"].seconds == pytest.approx(bwd_s(net, net.conv_layers, c, b) + copied)

    graph = strategies.get("groups").schedule(net, c, strategies.get("groups").Config(machines=4, groups=2), b)
    g = {t.name: t for t in graph.build(0)}  # built per iteration
    fwd = next(t for n, t in g.items() if "conv_fwd" in n)
    bwd = next(t for n, t in g.items() if "conv_bwd" in n)
    assert fwd.seconds == pytest.approx(fwd_s(net, net.conv_layers, c, b) + copy_s(p_c, c))
    assert bwd.seconds == pytest.approx(bwd_s(net, net.conv_layers, c, b) + copy_s(p_c, c))
    ralp = strategies.get("ralp")
    cfg = ralp.Config(workers=2, split="p2")
    p_head = param_bytes(net.head(cfg.split))
    r = tasks("ralp", cfg)
    assert [t.seconds for n, t in r.items() if n.startswith("set_params")] == pytest.approx([copy_s(p_head, c)] * 2)
    assert r["head_bwd@worker0"].seconds == pytest.approx(bwd_s(net, net.head(cfg.split), c, b) + copy_s(p_head, c))
