"""The cost engine against the papers' closed forms, under their assumptions (no latency, payload
efficiency 1, no compute unless stated), and its own mechanics (sharing, overlap, queues, unrolling)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from layerplan.cost.collectives import ALLREDUCE, recursive_doubling_rounds
from layerplan.cost import engine
from layerplan.cost.engine import Collective, Compute, Delay, StepGraph, Transfer, iteration_name, simulate
from layerplan.errors import ConfigError, SpecError
from layerplan.hardware import ClusterSpec, DeviceSpec, LinkSpec

GBIT10 = 10e9 / 8  # 1.25 GB/s


def cluster(bandwidth=GBIT10, latency=0.0, nodes=1024, shared_cores=None, efficiency=1.0, switch=None):
    dev = DeviceSpec(name="dev", peak_flops_per_s=1e12, mem_bandwidth_bytes_per_s=1e11, memory_bytes=1e10)
    nic = LinkSpec(name="nic", bandwidth_bytes_per_s=bandwidth, latency_s=latency, efficiency=efficiency)
    return ClusterSpec(name="test", nodes=nodes, device=dev, nic=nic, shared_cores=shared_cores,
                       switch_bandwidth_bytes_per_s=switch)


def ps_graph(n_w, n_s, params_bytes, t_compute=0.0, t_update=0.0):
    """BSP parameter servers: compute, push shards, update, pull shards."""
    shard = params_bytes / n_s
    return StepGraph(groups={"worker": n_w, "server": n_s}, samples_per_step=n_w, tasks=(
        Compute(name="fwd_bwd", group="worker", seconds=t_compute),
        Transfer(name="push", src="worker", dst="server", bytes_per_flow=shard, pattern="all_to_all", deps=("fwd_bwd",)),
        Compute(name="update", group="server", seconds=t_update, deps=("push",)),
        Transfer(name="pull", src="server", dst="worker", bytes_per_flow=shard, pattern="all_to_all", deps=("update",)),
    ))


# ---- Stanza ------------------------------------------------------------------------------------
@pytest.mark.parametrize("params,per_worker_mb,seconds", [(61.1e6, 488.8, 1.56), (138e6, 1104, 3.53)])
def test_stanza_table1(params, per_worker_mb, seconds):
    # Stanza Table 1 (4 workers + 1 server, 10 Gbit/s, fp32 grads + params). The paper's count: each
    # worker pushes P·4 B of gradients and pulls P·4 B of parameters (488.8 MB for AlexNet); all
    # four workers' traffic goes through the one server NIC — 4 × 244.4 MB in, then 4 × 244.4 MB
    # out (the pull waits for the update) — so 4 × 488.8 MB / 1.25 GB/s = 1.564 s.
    p = ps_graph(4, 1, params * 4)
    pred = simulate(p, cluster())
    per_worker = pred.bytes_sent_per_node["worker"] + pred.bytes_received_per_node["worker"]
    assert per_worker == pytest.approx(per_worker_mb * 1e6)
    assert pred.step_time_s == pytest.approx(4 * per_worker_mb * 1e6 / GBIT10)
    assert round(pred.step_time_s, 2) == seconds
    assert pred.bytes_received_per_node["server"] == pytest.approx(4 * params * 4)
    assert pred.bottleneck.startswith("server NIC (100% busy")


@pytest.mark.parametrize("n_w,n_s", [(4, 1), (8, 2), (16, 4), (7, 2), (12, 3), (64, 8), (1024, 64)])
def test_stanza_eq6(n_w, n_s):
    # Stanza eq.6: t_ps = 2·n_w·P/(n_s·B) + T_ps.
    p, t_ps = 200e6, 0.25
    pred = simulate(ps_graph(n_w, n_s, p, t_compute=t_ps), cluster())
    assert pred.step_time_s == pytest.approx(2 * n_w * p / (n_s * GBIT10) + t_ps)
    assert pred.total_bytes == pytest.approx(2 * n_w * p)


def test_ps_with_more_servers_than_workers_is_worker_bound():
    # eq.6 assumes n_w ≥ n_s; otherwise the workers' NICs bind: 2·P/B + T_ps.
    p = 200e6
    pred = simulate(ps_graph(2, 8, p, t_compute=0.1), cluster())
    assert pred.step_time_s == pytest.approx(2 * p / GBIT10 + 0.1)
    assert "worker NIC" in pred.bottleneck


def stanza_graph(n_c, n_f, t_c, t_f, a_k, p_c):
    """Stanza's schedule with the paper's no-overlap sequencing: conv forward, activations to the
    FC worker, FC forward+backward for its n_c/n_f CONV workers, gradients back, conv backward,
    recursive-doubling all-reduce of the conv gradients."""
    return StepGraph(groups={"conv": n_c, "fc": n_f}, samples_per_step=n_c, tasks=(
        Compute(name="conv_fwd", group="conv", seconds=t_c / 2),
        Transfer(name="activations", src="conv", dst="fc", bytes_per_flow=a_k, pattern="spread", deps=("conv_fwd",)),
        Compute(name="fc", group="fc", seconds=n_c / n_f * t_f, deps=("activations",)),
        Transfer(name="act_grads", src="fc", dst="conv", bytes_per_flow=a_k, pattern="broadcast", deps=("fc",)),
        Compute(name="conv_bwd", group="conv", seconds=t_c / 2, deps=("act_grads",)),
        Collective(name="conv_allreduce", group="conv", scheme="recursive_doubling", bytes=p_c, deps=("conv_bwd",)),
    ))


@pytest.mark.parametrize("n_c,n_f", [(n, 1) for n in range(2, 11)] + [(4, 2), (6, 2), (9, 3), (8, 4), (10, 5)])
def test_stanza_eq3(n_c, n_f):
    # Stanza eq.3: t_s = T_c + (n_c/n_f)·T_f + 2·n_c·A·K/(n_f·B) + P_c·R(n_c)/B.
    t_c, t_f, a_k, p_c = 0.4, 0.03, 9216 * 4 * 128, 2.47e6 * 4
    b = GBIT10
    want = t_c + n_c / n_f * t_f + 2 * n_c * a_k / (n_f * b) + p_c * recursive_doubling_rounds(n_c) / b
    pred = simulate(stanza_graph(n_c, n_f, t_c, t_f, a_k, p_c), cluster(bandwidth=b))
    assert pred.step_time_s == pytest.approx(want)
    # bytes: each CONV worker sends A·K up and its all-reduce share
    assert pred.bytes_per_link["conv->fc"] == pytest.approx(n_c * a_k)
    assert pred.bytes_per_link["fc->conv"] == pytest.approx(n_c * a_k)


# ---- PALEO -------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 4, 8, 16, 32])
def test_paleo_schemes_in_the_engine(k):
    s = 244e6
    t = s / GBIT10  # PALEO §2: T = |D|/B
    c = cluster()

    def run(scheme, n):
        g = StepGraph(groups={"w": n}, samples_per_step=n,
                      tasks=(Collective(name="ar", group="w", scheme=scheme, bytes=s),))
        return simulate(g, c).step_time_s

    assert run("one_to_all", k + 1) == pytest.approx(2 * k * t)  # K workers + a master
    assert run("tree", k) == pytest.approx(2 * math.log2(k) * t)
    assert run("butterfly", k) == pytest.approx(math.log2(k) * t)
    # the same OneToAll written as transfers: K workers into a master, then back
    g = StepGraph(groups={"worker": k, "master": 1}, samples_per_step=k, tasks=(
        Transfer(name="gather", src="worker", dst="master", bytes_per_flow=s, pattern="spread"),
        Transfer(name="bcast", src="master", dst="worker", bytes_per_flow=s, pattern="broadcast", deps=("gather",)),
    ))
    assert simulate(g, c).step_time_s == pytest.approx(2 * k * t)


@pytest.mark.parametrize("w", [2, 3, 4, 8, 16])
def test_ring_allreduce_bytes(w):
    # RALP: Horovod's ring moves 2·S·(W−1) per step.
    s = 100e6
    g = StepGraph(groups={"worker": w}, samples_per_step=w,
                  tasks=(Collective(name="ar", group="worker", scheme="ring", bytes=s),))
    pred = simulate(g, cluster())
    assert pred.total_bytes == pytest.approx(2 * s * (w - 1))
    assert pred.bytes_sent_per_node["worker"] == pytest.approx(2 * (w - 1) / w * s)
    assert pred.payload_sent_per_node["worker"] == pytest.approx(s)  # the runtime's count
    assert pred.step_time_s == pytest.approx(2 * (w - 1) / w * s / GBIT10)


@pytest.mark.parametrize("scheme", list(ALLREDUCE))
def test_collective_latency_term(scheme):
    s, lat = 10e6, 1e-3
    g = StepGraph(groups={"w": 8}, samples_per_step=8, tasks=(Collective(name="ar", group="w", scheme=scheme, bytes=s),))
    cost = ALLREDUCE[scheme].cost(s, 8)
    assert simulate(g, cluster(latency=lat)).step_time_s == pytest.approx(cost.time_s(GBIT10, lat))


# ---- Omnivore ----------------------------------------------------------------------------------
def he(g, t_conv, t_fc):
    return max(t_fc, (t_conv + t_fc) / g)  # Omnivore §IV-B HE(g)


def omnivore_graph(g, t_conv, t_fc, iterations=30):
    """g asynchronous groups: each runs its conv phase, then the merged FC server serves the
    group's batch, one batch at a time in arrival order; a group starts its next conv phase when
    its FC results are back."""
    tasks = []
    for j in range(g):
        tasks.append(Compute(name=f"conv{j}", group=f"group{j}", seconds=t_conv, deps=(f"prev/fc{j}",)))
        tasks.append(Compute(name=f"fc{j}", group="fc", seconds=t_fc, deps=(f"conv{j}",), queue="fc_server"))
    groups = {f"group{j}": 1 for j in range(g)} | {"fc": 1}
    return StepGraph(groups=groups, tasks=tuple(tasks), samples_per_step=g, iterations=iterations)


@pytest.mark.parametrize("g", [1, 2, 3, 4, 5, 8, 16])
def test_omnivore_he(g):
    # t_conv + t_fc = 1.3: the FC server saturates from g = 1.3/0.3 ≈ 4.33 on.
    t_conv, t_fc = 1.0, 0.3
    pred = simulate(omnivore_graph(g, t_conv, t_fc), cluster())
    assert pred.step_time_s / g == pytest.approx(he(g, t_conv, t_fc), rel=1e-9)
    saturated = t_conv + t_fc < g * t_fc  # Omnivore §IV-B: FC saturation
    assert (pred.bottleneck == "fc compute (100% busy)") == saturated


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_omnivore_he_with_group_size(k):
    # t_conv(k) = max(T_cc/k, T_nc·k): a group of k machines splits the conv compute and pays for
    # the conv model going to each of them (Omnivore appendix D).
    t_cc, t_nc, t_fc, n = 4.0, 0.05, 0.3, 16
    t_conv = max(t_cc / k, t_nc * k)
    g = n // k
    pred = simulate(omnivore_graph(g, t_conv, t_fc, iterations=24), cluster())
    assert pred.step_time_s / g == pytest.approx(he(g, t_conv, t_fc), rel=1e-9)


def test_omnivore_builder_form():
    # The same schedule written with a builder: each FC task names its group's previous FC task.
    g, t_conv, t_fc = 3, 1.0, 0.5

    def build(i):
        out = []
        for j in range(g):
            deps = () if i == 0 else (iteration_name(i - 1, f"fc{j}"),)
            out.append(Compute(name=iteration_name(i, f"conv{j}"), group=f"group{j}", seconds=t_conv, deps=deps))
            out.append(Compute(name=iteration_name(i, f"fc{j}"), group="fc", seconds=t_fc,
                               deps=(iteration_name(i, f"conv{j}"),), queue="fc_server"))
        return out

    graph = StepGraph(groups={f"group{j}": 1 for j in range(g)} | {"fc": 1}, samples_per_step=g, build=build, iterations=20)
    pred = simulate(graph, cluster())
    assert pred.step_time_s / g == pytest.approx(he(g, t_conv, t_fc))
    # per step, the FC server computes g·t_fc
    assert pred.breakdown["fc"]["compute_s"] == pytest.approx(g * t_fc)


# ---- NICs, cores, overlap ----------------------------------------------------------------------
def test_incast_shares_the_receiving_nic():
    # 3 workers × 20 MB into one node at 1 Gbit/s: 60 MB / 125 MB/s = 0.48 s.
    g = StepGraph(groups={"worker": 3, "sink": 1}, samples_per_step=3, tasks=(
        Transfer(name="send", src="worker", dst="sink", bytes_per_flow=20e6, pattern="spread"),))
    pred = simulate(g, cluster(bandwidth=1e9 / 8))
    assert pred.step_time_s == pytest.approx(0.48)
    assert pred.bottleneck == "sink NIC ingress (100% busy)"


def test_full_duplex():
    c = cluster(bandwidth=1e9 / 8)
    one = StepGraph(groups={"a": 1, "b": 1}, samples_per_step=1, tasks=(
        Transfer(name="ab", src="a", dst="b", bytes_per_flow=20e6, pattern="spread"),))
    both = StepGraph(groups={"a": 1, "b": 1}, samples_per_step=1, tasks=(
        Transfer(name="ab", src="a", dst="b", bytes_per_flow=20e6, pattern="spread"),
        Transfer(name="ba", src="b", dst="a", bytes_per_flow=20e6, pattern="spread"),))
    assert simulate(both, c).step_time_s == pytest.approx(simulate(one, c).step_time_s) == pytest.approx(0.16)
    # two transfers the same way share the link
    same = StepGraph(groups={"a": 1, "b": 1}, samples_per_step=1, tasks=(
        Transfer(name="x", src="a", dst="b", bytes_per_flow=20e6, pattern="spread"),
        Transfer(name="y", src="a", dst="b", bytes_per_flow=20e6, pattern="spread"),))
    assert simulate(same, c).step_time_s == pytest.approx(0.32)


def test_a_link_that_is_not_fully_duplex():
    """duplex_efficiency d: both directions busy, each keeps d of the payload rate; one alone, all of it."""
    c = cluster(bandwidth=1e9 / 8)
    c = replace(c, nic=replace(c.nic, duplex_efficiency=0.9))
    one = StepGraph(groups={"a": 1, "b": 1}, samples_per_step=1, tasks=(
        Transfer(name="ab", src="a", dst="b", bytes_per_flow=20e6, pattern="spread"),))
    both = StepGraph(groups={"a": 1, "b": 1}, samples_per_step=1, tasks=(
        Transfer(name="ab", src="a", dst="b", bytes_per_flow=20e6, pattern="spread"),
        Transfer(name="ba", src="b", dst="a", bytes_per_flow=20e6, pattern="spread"),))
    assert simulate(one, c).step_time_s == pytest.approx(0.16)
    assert simulate(both, c).step_time_s == pytest.approx(0.16 / 0.9)
    # a 2-node ring all-reduce sends and receives at once: the same d
    ring = StepGraph(groups={"w": 2}, samples_per_step=1, tasks=(
        Collective(name="ar", group="w", scheme="ring", bytes=20e6),))
    full = simulate(ring, cluster(bandwidth=1e9 / 8)).step_time_s
    assert simulate(ring, c).step_time_s == pytest.approx(full / 0.9)
    with pytest.raises(SpecError, match="duplex_efficiency"):
        replace(c.nic, duplex_efficiency=0.2)


def test_max_min_fairness():
    # a→sink (1 flow) and 3 workers→sink compete for the sink's ingress; a also sends to b.
    # sink ingress: 4 flows → B/4 each; a's egress carries a→sink (B/4) and a→b gets the rest (3B/4).
    b = 100e6
    g = StepGraph(groups={"a": 1, "w": 3, "sink": 1, "b": 1}, samples_per_step=1, tasks=(
        Transfer(name="a_sink", src="a", dst="sink", bytes_per_flow=25e6, pattern="spread"),
        Transfer(name="w_sink", src="w", dst="sink", bytes_per_flow=25e6, pattern="spread"),
        Transfer(name="a_b", src="a", dst="b", bytes_per_flow=75e6, pattern="spread"),
    ))
    pred = simulate(g, cluster(bandwidth=b))
    ends = {e.name: e.end_s for e in pred.timeline}
    assert ends["a_sink"] == pytest.approx(1.0) and ends["w_sink"] == pytest.approx(1.0)
    assert ends["a_b"] == pytest.approx(1.0)


def test_shared_cores():
    # 4 compute tasks of 1 s on 4 nodes sharing 2 cores: 2 s (the emulated cluster's 2× slowdown).
    g = StepGraph(groups={"w": 4}, samples_per_step=4, tasks=(Compute(name="c", group="w", seconds=1.0),))
    pred = simulate(g, cluster(shared_cores=2))
    assert pred.step_time_s == pytest.approx(2.0)
    assert pred.bottleneck == "shared cores (100% busy)"
    assert pred.breakdown["w"]["compute_s"] == pytest.approx(2.0)  # shared: twice as long as
    assert pred.breakdown["w"]["compute_work_s"] == pytest.approx(1.0)  # its work alone
    assert simulate(g, cluster()).step_time_s == pytest.approx(1.0)
    # across roles too: 3 + 1 nodes on 2 cores
    g2 = StepGraph(groups={"w": 3, "s": 1}, samples_per_step=3, tasks=(
        Compute(name="c", group="w", seconds=1.0), Compute(name="d", group="s", seconds=1.0)))
    assert simulate(g2, cluster(shared_cores=2)).step_time_s == pytest.approx(2.0)
    # fewer tasks than cores run at full speed
    g3 = StepGraph(groups={"w": 2}, samples_per_step=2, tasks=(Compute(name="c", group="w", seconds=1.0),))
    assert simulate(g3, cluster(shared_cores=4)).step_time_s == pytest.approx(1.0)
    # contention: two busy cores give 1.6 cores' worth; one task alone still runs at full speed
    busy = replace(cluster(shared_cores=2), shared_core_capacity=1.6)
    assert simulate(g3, busy).step_time_s == pytest.approx(2 / 1.6)
    g1 = StepGraph(groups={"w": 1}, samples_per_step=1, tasks=(Compute(name="c", group="w", seconds=1.0),))
    assert simulate(g1, busy).step_time_s == pytest.approx(1.0)
    assert simulate(g, busy).step_time_s == pytest.approx(4 / 1.6)
    with pytest.raises(SpecError, match="shared_core_capacity"):
        replace(busy, shared_core_capacity=2.5)
    with pytest.raises(SpecError, match="shared_core_capacity"):
        replace(busy, shared_cores=None)


def test_more_compute_threads_than_cores_get_the_oversubscribed_capacity():
    """While more compute threads run than there are shared cores, the cores give
    oversubscribed_core_capacity; as many threads as cores or fewer keep shared_core_capacity."""
    c = replace(cluster(shared_cores=2), shared_core_capacity=1.9, oversubscribed_core_capacity=1.6)
    four = StepGraph(groups={"w": 4}, samples_per_step=4, tasks=(Compute(name="c", group="w", seconds=1.0),))
    two = StepGraph(groups={"w": 2}, samples_per_step=2, tasks=(Compute(name="c", group="w", seconds=1.0),))
    assert simulate(four, c).step_time_s == pytest.approx(4 / 1.6)
    assert simulate(two, c).step_time_s == pytest.approx(2 / 1.9)
    assert simulate(four, replace(c, oversubscribed_core_capacity=None)).step_time_s == pytest.approx(4 / 1.9)
    # 3 threads (2 + 1 in two roles): oversubscribed until the 2-node role's second of work is done
    mixed = StepGraph(groups={"w": 2, "s": 1}, samples_per_step=2, tasks=(
        Compute(name="c", group="w", seconds=1.0), Compute(name="d", group="s", seconds=3.0)))
    # 3 threads share 1.6: 0.533 each until w's 1 s of work is done (1.875 s), then s alone at 1
    assert simulate(mixed, c).step_time_s == pytest.approx(1 / (1.6 / 3) + (3 - 1))
    with pytest.raises(SpecError, match="oversubscribed_core_capacity"):
        replace(c, oversubscribed_core_capacity=2.5)
    with pytest.raises(SpecError, match="oversubscribed_core_capacity"):
        replace(c, shared_cores=None, shared_core_capacity=None)


def test_messages_threads_oversubscribe_the_cores_by_the_cores_they_take():
    """The compute threads plus the cores' worth the messages take, beyond the cores, move the
    capacity from shared_core_capacity to oversubscribed_core_capacity (a whole thread more: all
    the way)."""
    c = replace(cluster(bandwidth=1e9, latency=0.0, nodes=4, shared_cores=2), shared_core_capacity=1.9,
                oversubscribed_core_capacity=1.6, comm_cpu_s_per_byte=2.5e-10)
    work = Compute(name="c", group="w", seconds=1.0)
    msg = Transfer(name="t", src="a", dst="b", bytes_per_flow=10e9, pattern="spread")  # 10 s at line rate
    beside = StepGraph(groups={"a": 1, "b": 1, "w": 2}, samples_per_step=1, tasks=(work, msg))
    # the message takes 2 · 2.5e-10 · 1e9 = 0.5 of a core beside 2 compute threads: half a thread too
    # many, capacity 1.9 − 0.5 · 0.3 = 1.75, of which the compute threads get 1.25
    timeline = {e.name: e for e in simulate(beside, c).timeline}
    assert timeline["c"].end_s == pytest.approx(1.0 / ((1.75 - 0.5) / 2))
    flat = replace(c, oversubscribed_core_capacity=1.9)  # no loss to oversubscription: the old rule
    assert {e.name: e for e in simulate(beside, flat).timeline}["c"].end_s == pytest.approx(1.0 / ((1.9 - 0.5) / 2))
    # one compute thread and the message fit the 2 cores: the compute runs at full speed
    one = StepGraph(groups={"a": 1, "b": 1, "w": 1}, samples_per_step=1, tasks=(work, msg))
    assert {e.name: e for e in simulate(one, c).timeline}["c"].end_s == pytest.approx(1.0)


def test_more_ranks_than_cores_wait_at_every_round_and_message():
    """oversubscribed_wait_s is added to each ring round and each message's latency when the step's
    nodes outnumber the shared cores, and only then."""
    c = replace(cluster(bandwidth=1e9, latency=1e-4, nodes=8, shared_cores=2), oversubscribed_wait_s=1e-3)
    ring = Collective(name="ar", group="w", scheme="ring", bytes=0.0)

    def step(n):
        return simulate(StepGraph(groups={"w": n}, samples_per_step=n, tasks=(ring,)), c).step_time_s

    assert step(2) == pytest.approx(2 * 1e-4)  # 2 rounds, 2 ranks on 2 cores: the link's latency only
    assert step(4) == pytest.approx(6 * (1e-4 + 1e-3))  # 6 rounds, 4 ranks on 2 cores
    msg = Transfer(name="t", src="a", dst="b", bytes_per_flow=0.0, pattern="all_to_all")
    two = StepGraph(groups={"a": 1, "b": 1}, samples_per_step=1, tasks=(msg,))
    three = StepGraph(groups={"a": 2, "b": 1}, samples_per_step=1, tasks=(msg,))
    assert simulate(two, c).step_time_s == pytest.approx(1e-4)
    assert simulate(three, c).step_time_s == pytest.approx(1e-4 + 1e-3)
    assert simulate(three, replace(c, shared_cores=None)).step_time_s == pytest.approx(1e-4)
    with pytest.raises(SpecError, match="oversubscribed_wait_s"):
        replace(c, oversubscribed_wait_s=-1.0)


def test_a_message_costs_cpu_at_each_end_on_oversubscribed_cores_while_compute_takes_them():
    """oversubscribed_message_cpu_s: each node that sends or receives a transfer spends it on the
    shared cores, when the step's nodes outnumber them and the transfer starts while the compute
    running takes every core (and only then), slowing that compute."""
    c = replace(cluster(bandwidth=1e12, latency=0.0, nodes=8, shared_cores=2), oversubscribed_message_cpu_s=1e-3)
    msg = Transfer(name="t", src="a", dst="b", bytes_per_flow=1e3, pattern="spread")
    # 2 senders and 1 receiver with nothing computing: a core is free, the ranks wake there
    alone = StepGraph(groups={"a": 2, "b": 1}, samples_per_step=1, tasks=(msg,))
    assert simulate(alone, c).step_time_s < 1e-6
    # beside 2 compute threads (both cores busy): 3 ms of CPU for the bytes' nanosecond, on cores it
    # shares with the compute (more than the 1.5 ms it would take both cores for), and the compute
    # gets less of them
    work = Compute(name="c", group="w", seconds=1.0)
    beside = StepGraph(groups={"a": 2, "b": 1, "w": 2}, samples_per_step=1, tasks=(work, msg))
    timeline = {e.name: e for e in simulate(beside, c).timeline}
    assert timeline["t"].end_s - timeline["t"].start_s > 1.5e-3
    assert simulate(beside, c).step_time_s > 1.0
    assert simulate(beside, replace(c, oversubscribed_message_cpu_s=0.0)).step_time_s == pytest.approx(1.0)
    assert simulate(beside, replace(c, shared_cores=5)).step_time_s == pytest.approx(1.0)  # 5 nodes on 5 cores
    # one compute thread leaves a core free: not charged
    one = StepGraph(groups={"a": 2, "b": 1, "w": 1}, samples_per_step=1, tasks=(work, msg))
    assert simulate(one, c).step_time_s == pytest.approx(1.0)
    with pytest.raises(SpecError, match="oversubscribed_message_cpu_s"):
        replace(c, oversubscribed_message_cpu_s=-1.0)


def test_every_collective_call_waits_on_shared_cores():
    """collective_wait_s is added once to every collective call of two or more nodes on shared
    cores (not per round, not to messages, not without shared cores), but not to a call that
    follows only calls of its own group: its ranks have just met."""
    c = replace(cluster(bandwidth=1e9, latency=1e-4, nodes=8, shared_cores=2), collective_wait_s=2e-3)
    ring = Collective(name="ar", group="w", scheme="ring", bytes=0.0)
    bcast = Collective(name="b", group="w", scheme="scatter", bytes=0.0, deps=("ar",))

    def step(n, cl=c, tasks=(ring,)):
        return simulate(StepGraph(groups={"w": n}, samples_per_step=n, tasks=tasks), cl).step_time_s

    assert step(2) == pytest.approx(2 * 1e-4 + 2e-3)  # 2 rounds of latency, one call's wait
    assert step(2, tasks=(ring, bcast)) == pytest.approx(2 * 1e-4 + 1e-4 + 2e-3)  # back to back: one wait
    work = Compute(name="work", group="w", seconds=0.01, deps=("ar",))
    after = replace(bcast, deps=("work",))
    assert step(2, tasks=(ring, work, after)) == pytest.approx(2 * 1e-4 + 1e-4 + 0.01 + 2 * 2e-3)  # work between: two
    assert step(1) == pytest.approx(0.0)  # a collective of one node meets nobody
    assert step(2, replace(c, shared_cores=None)) == pytest.approx(2 * 1e-4)
    msg = Transfer(name="t", src="a", dst="b", bytes_per_flow=0.0, pattern="all_to_all")
    assert simulate(StepGraph(groups={"a": 1, "b": 1}, samples_per_step=1, tasks=(msg,)), c).step_time_s == pytest.approx(1e-4)
    with pytest.raises(SpecError, match="collective_wait_s"):
        replace(c, collective_wait_s=-1.0)


def ddp_like(n: int, bucket_bytes: float) -> StepGraph:
    """DDP's shape: forward, two buckets' backward, each bucket's all-reduce as it is ready, then the
    buckets copied back and the update once every all-reduce is done (per-core seconds)."""
    return StepGraph(groups={"w": n}, samples_per_step=n, tasks=(
        Compute(name="fwd", group="w", seconds=0.1),
        Compute(name="bwd0", group="w", seconds=0.02, deps=("fwd",)),
        Collective(name="ar0", group="w", scheme="ring", bytes=bucket_bytes, deps=("bwd0",)),
        Compute(name="bwd1", group="w", seconds=0.05, deps=("bwd0",)),
        Collective(name="ar1", group="w", scheme="ring", bytes=0.0, deps=("bwd1",)),
        Compute(name="unbucket", group="w", seconds=0.01, deps=("bwd1", "ar0", "ar1")),
        Compute(name="update", group="w", seconds=0.02, deps=("unbucket",)),
    ))


def test_expected_max_of_normals():
    assert engine.expected_max_normal(1) == 0.0
    assert engine.expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert engine.expected_max_normal(4) == pytest.approx(1.0294, abs=1e-4)
    assert engine.expected_max_normal(5) > engine.expected_max_normal(4)


def test_an_oversubscribed_groups_call_waits_for_its_last_rank(monkeypatch):
    """On more ranks than cores, a collective waits E[max of n] · RANK_SPREAD · the ranks' compute
    since they last met (the step's tail before the forward, in a one-iteration graph), capped by
    the compute that may run past the call: the first bucket's all-reduce (link-bound, so the step
    ends with it) starts that much later; the last bucket's call, with nothing left to run past
    it, and any call with no more ranks than cores, wait nothing more."""
    c = cluster(bandwidth=1e9, nodes=8, shared_cores=2)

    def step(n: int, spread: float) -> float:
        monkeypatch.setattr(engine, "RANK_SPREAD", spread)
        return simulate(ddp_like(n, 1e8), c).step_time_s

    # ar0: since the last meeting, the update and unbucket of the step before, the forward and bwd0
    # (0.15 s a core); past the call, bwd1 (0.05 s): 4 ranks on 2 cores, each at half a core
    lag_s = engine.expected_max_normal(4) * 0.13 * 0.05 / 0.5
    assert step(4, 0.13) - step(4, 0.0) == pytest.approx(lag_s, rel=1e-6)
    assert step(2, 0.13) == pytest.approx(step(2, 0.0))  # a core for each rank: no lag
    pred = simulate(ddp_like(4, 1e8), c)
    ar1 = next(e for e in pred.timeline if e.name == "ar1")
    bwd1 = next(e for e in pred.timeline if e.name == "bwd1")
    assert ar1.start_s == pytest.approx(bwd1.end_s)  # the last bucket: no lag


def test_a_gather_meets_and_its_receivers_wake_cold_on_shared_cores():
    """A transfer that ``meets`` waits collective_wait_s on shared cores where two or more nodes send
    (the receiver waits for the slowest); one that ``wakes`` its receivers costs them
    oversubscribed_message_cpu_s where the step's nodes outnumber the cores, even with cores free."""
    c = replace(cluster(bandwidth=1e9, latency=1e-4, nodes=8, shared_cores=2), collective_wait_s=2e-3,
                oversubscribed_message_cpu_s=5e-4)
    gather = Transfer(name="g", src="conv", dst="fc", bytes_per_flow=0.0, pattern="spread", meets=True, wakes=True)

    def step(groups, cl=c, t=gather):
        return simulate(StepGraph(groups=groups, samples_per_step=1, tasks=(t,)), cl).step_time_s

    assert step({"conv": 2, "fc": 1}) == pytest.approx(1e-4 + 2e-3 + 5e-4)  # 3 nodes on 2 cores: both
    assert step({"conv": 2, "fc": 1}, replace(c, shared_cores=4)) == pytest.approx(1e-4 + 2e-3)  # cores enough: no cold wake
    assert step({"conv": 1, "fc": 1}) == pytest.approx(1e-4)  # one sender meets nobody
    assert step({"conv": 2, "fc": 1}, t=replace(gather, meets=False, wakes=False)) == pytest.approx(1e-4)
    assert step({"conv": 2, "fc": 1}, replace(c, shared_cores=None)) == pytest.approx(1e-4)


def test_moving_bytes_costs_the_shared_cores_cpu():
    """A 1 s transfer whose two ends need 0.5 core-seconds each, beside a 1 s compute task, on one
    shared core: 2 core-seconds of work on one core — both end at 2 s. Without the CPU cost, 1 s."""
    from dataclasses import replace

    size = GBIT10  # 1 s at the line rate
    g = StepGraph(groups={"a": 1, "b": 1}, samples_per_step=1, tasks=(
        Compute(name="c", group="a", seconds=1.0),
        Transfer(name="t", src="a", dst="b", bytes_per_flow=size, pattern="all_to_all")))
    base = cluster(nodes=2, shared_cores=1)
    assert simulate(g, base).step_time_s == pytest.approx(1.0)
    costly = replace(base, comm_cpu_s_per_byte=0.5 / size)
    assert simulate(g, costly).step_time_s == pytest.approx(2.0)
    assert simulate(g, replace(costly, shared_cores=None)).step_time_s == pytest.approx(1.0)  # no shared pool: free
    # a 2-node ring all-reduce of S: each node sends S and receives S (CPU 2·S·c per node, both
    # ends counted once each) and reduces S/2; alone on 2 cores at c = 1/(4·S) per byte and
    # c_red = 1/S per byte: 2·(2S·c) + 2·(S/2)·c_red = 1 + 1 core-seconds over 2 cores = 1 s,
    # slower than the 0.8 s the NIC allows
    s_bytes = 0.8 * GBIT10  # the ring moves S per node: 0.8 s at the line rate
    ar = StepGraph(groups={"w": 2}, samples_per_step=2, tasks=(Collective(name="ar", group="w", scheme="ring", bytes=s_bytes),))
    two = cluster(nodes=2, shared_cores=2)
    assert simulate(ar, two).step_time_s == pytest.approx(0.8)
    slow = replace(two, comm_cpu_s_per_byte=1 / (4 * s_bytes), reduce_cpu_s_per_byte=1 / s_bytes)
    assert simulate(ar, slow).step_time_s == pytest.approx(1.0)
    # measured beside its ranks' compute: the larger of that and the idle-core charge, per byte sent
    # (the ring's 2·S): 2/S a byte is 4 core-seconds over 2 cores; 0.5/S (1 core-second) is below
    # the idle-core charge's 2 and leaves it
    assert simulate(ar, replace(slow, collective_busy_cpu_s_per_byte=2 / s_bytes)).step_time_s == pytest.approx(2.0)
    assert simulate(ar, replace(slow, collective_busy_cpu_s_per_byte=0.5 / s_bytes)).step_time_s == pytest.approx(1.0)
    # each rank's thread keeps at most half a core busy: the same 2 core-seconds at 2 × 0.5 cores
    assert simulate(ar, replace(slow, collective_core_share=0.5)).step_time_s == pytest.approx(2.0)
    assert simulate(ar, replace(slow, collective_core_share=1.0)).step_time_s == pytest.approx(1.0)  # the cores bind first
    assert simulate(ar, replace(two, collective_core_share=0.5)).step_time_s == pytest.approx(0.8)  # no CPU: no bound
    # 4 ranks on the 2 cores: 4 × 0.6 cores is more than the 2 there are, which still bind
    ar4 = StepGraph(groups={"w": 4}, samples_per_step=4, tasks=(Collective(name="ar", group="w", scheme="ring", bytes=s_bytes),))
    four = replace(slow, nodes=4)
    assert simulate(ar4, replace(four, collective_core_share=0.6)).step_time_s == pytest.approx(simulate(ar4, four).step_time_s)


def test_processor_sharing_on_one_node():
    # two compute tasks on the same node share its device: both end at 2 s
    g = StepGraph(groups={"w": 2}, samples_per_step=2, tasks=(
        Compute(name="a", group="w", seconds=1.0), Compute(name="b", group="w", seconds=1.0)))
    pred = simulate(g, cluster())
    assert [e.end_s for e in pred.timeline] == pytest.approx([2.0, 2.0])


def test_compute_and_transfer_overlap():
    # independent compute and transfer on the same node overlap: max, not sum
    g = StepGraph(groups={"w": 1, "s": 1}, samples_per_step=1, tasks=(
        Compute(name="c", group="w", seconds=1.0),
        Transfer(name="t", src="w", dst="s", bytes_per_flow=GBIT10 * 0.8, pattern="spread")))
    pred = simulate(g, cluster())
    assert pred.step_time_s == pytest.approx(1.0)
    assert pred.breakdown["w"] == pytest.approx({"compute_s": 1.0, "comm_s": 0.8, "compute_work_s": 1.0})
    # with a dependency they add up
    g2 = StepGraph(groups={"w": 1, "s": 1}, samples_per_step=1, tasks=(
        Compute(name="c", group="w", seconds=1.0),
        Transfer(name="t", src="w", dst="s", bytes_per_flow=GBIT10 * 0.8, pattern="spread", deps=("c",))))
    assert simulate(g2, cluster()).step_time_s == pytest.approx(1.8)


# ---- Yan ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_ps,n_mr,n_wr", [(1, 1, 1), (4, 1, 1), (4, 1, 2), (4, 1, 4), (4, 1, 8), (1, 3, 2), (4, 2, 2),
                                           (8, 4, 2), (2, 5, 4), (16, 2, 8)])
def test_yan_ps_read_bounds(n_ps, n_mr, n_wr):
    # A replica reads all weights W(l) of every layer from the N_ps servers (each holds 1/N_ps of
    # them); each of its N_wr workers reads its 1/N_wr share; the N_mr replicas read at once.
    # Yan eq.11 (best: a replica uses min(N_ps, N_wr) links) ≤ engine ≤ eq.10 (worst: N_mr·W over
    # one link); eq.11 is reached with a single replica, eq.10 with a single server.
    weights = [3e6, 50e6, 12e6]  # bytes per layer
    ncost = 1e-4
    c = cluster(latency=ncost)
    tasks, prev = [], ()
    for i, w in enumerate(weights):
        tasks.append(Transfer(name=f"read{i}", src="ps", dst="worker", bytes_per_flow=w / (n_ps * n_wr),
                              pattern="all_to_all", deps=prev))
        prev = (f"read{i}",)
    g = StepGraph(groups={"ps": n_ps, "worker": n_mr * n_wr}, samples_per_step=1, tasks=tuple(tasks))
    t = simulate(g, c).step_time_s
    best = sum(ncost + w / (GBIT10 * min(n_ps, n_wr)) for w in weights)  # Yan eq.11
    worst = sum(ncost + n_mr * w / GBIT10 for w in weights)  # Yan eq.10
    assert best * (1 - 1e-9) <= t <= worst * (1 + 1e-9)
    if n_mr == 1:
        assert t == pytest.approx(best)
    if n_ps == 1:
        assert t == pytest.approx(worst)
    # and the engine agrees with plan/yan.py's closed form between the bounds
    from layerplan.plan import yan

    costs = yan.YanCosts(c_muladd_s=0, c_act_s=0, c_err_s=0, c_ncost_s=ncost, c_bits=32, c_nbw_bits_per_s=8 * GBIT10)
    layers = [yan.YanLayer(name=str(i), connections=0, neurons=0, weights=w / 4, dense=True) for i, w in enumerate(weights)]
    assert t == pytest.approx(yan.ps_read_time_s(layers, n_ps, n_mr, n_wr, costs))


# ---- mechanics ---------------------------------------------------------------------------------
def test_latency_and_messages():
    c = cluster(latency=1e-3)
    g = StepGraph(groups={"a": 1, "b": 1}, samples_per_step=1, tasks=(
        Transfer(name="t", src="a", dst="b", bytes_per_flow=GBIT10 * 0.1, pattern="spread", messages=3),
        Delay(name="d", seconds=0.5, deps=("t",), group="a")))
    pred = simulate(g, c)
    assert pred.step_time_s == pytest.approx(0.003 + 0.1 + 0.5)
    assert [e.tag for e in pred.timeline if e.group == "a"] == ["comm", "delay"]


def test_latency_bound_bottleneck():
    g = StepGraph(groups={"w": 64}, samples_per_step=64, tasks=(Collective(name="ar", group="w", scheme="ring", bytes=1e3),))
    pred = simulate(g, cluster(latency=1e-4))
    assert pred.bottleneck.startswith("network latency")


def test_patterns_and_uneven_spread():
    c = cluster(bandwidth=100e6)
    # 5 sources over 2 destinations: the busier destination receives 3 flows
    g = StepGraph(groups={"c": 5, "f": 2}, samples_per_step=5, tasks=(
        Transfer(name="t", src="c", dst="f", bytes_per_flow=100e6, pattern="spread"),))
    pred = simulate(g, c)
    assert pred.step_time_s == pytest.approx(3.0)
    assert pred.total_bytes == pytest.approx(500e6)
    assert pred.bytes_received_per_node["f"] == pytest.approx(250e6)
    # within: a neighbour exchange
    w = StepGraph(groups={"w": 4}, samples_per_step=4, tasks=(
        Transfer(name="x", src="w", dst="w", bytes_per_flow=100e6, pattern="within"),))
    assert simulate(w, c).step_time_s == pytest.approx(1.0)
    # all_to_all inside one group: every node to every other node
    a = StepGraph(groups={"w": 4}, samples_per_step=4, tasks=(
        Transfer(name="x", src="w", dst="w", bytes_per_flow=100e6, pattern="all_to_all"),))
    pa = simulate(a, c)
    assert pa.step_time_s == pytest.approx(3.0) and pa.total_bytes == pytest.approx(12 * 100e6)
    # one node alone: nothing moves
    one = StepGraph(groups={"w": 1}, samples_per_step=1, tasks=(
        Transfer(name="x", src="w", dst="w", bytes_per_flow=100e6, pattern="within"),
        Collective(name="ar", group="w", scheme="ring", bytes=1e9)))
    p1 = simulate(one, cluster(latency=1.0))
    assert p1.step_time_s == 0.0 and p1.total_bytes == 0.0 and p1.bottleneck == "none"


def test_switch_capacity():
    # 8 disjoint pairs at 1 GB/s each through a 4 GB/s switch: 2× slower
    g = StepGraph(groups={"a": 8, "b": 8}, samples_per_step=1, tasks=(
        Transfer(name="t", src="a", dst="b", bytes_per_flow=1e9, pattern="spread"),))
    assert simulate(g, cluster(bandwidth=1e9)).step_time_s == pytest.approx(1.0)
    pred = simulate(g, cluster(bandwidth=1e9, switch=4e9))
    assert pred.step_time_s == pytest.approx(2.0)
    assert pred.bottleneck.startswith("switch")


def test_nic_efficiency():
    g = StepGraph(groups={"a": 1, "b": 1}, samples_per_step=1, tasks=(
        Transfer(name="t", src="a", dst="b", bytes_per_flow=1e9, pattern="spread"),))
    assert simulate(g, cluster(bandwidth=1e9, efficiency=0.5)).step_time_s == pytest.approx(2.0)


def test_queue_serves_in_arrival_order():
    # RALP's PS worker: one worker's activations at a time, first come first served.
    g = StepGraph(groups={"w0": 1, "w1": 1, "w2": 1, "ps": 1}, samples_per_step=3, tasks=(
        Compute(name="h2", group="w2", seconds=0.1),
        Compute(name="h0", group="w0", seconds=0.3),
        Compute(name="h1", group="w1", seconds=0.2),
        Compute(name="t0", group="ps", seconds=1.0, deps=("h0",), queue="ps"),
        Compute(name="t1", group="ps", seconds=1.0, deps=("h1",), queue="ps"),
        Compute(name="t2", group="ps", seconds=1.0, deps=("h2",), queue="ps"),
    ))
    pred = simulate(g, cluster())
    starts = {e.name: e.start_s for e in pred.timeline}
    assert starts["t2"] == pytest.approx(0.1) and starts["t1"] == pytest.approx(1.1) and starts["t0"] == pytest.approx(2.1)
    assert pred.step_time_s == pytest.approx(3.1)


def test_a_task_made_ready_by_its_queue_predecessor_goes_next():
    """A server finishes what it started: the task that follows one of its queue (the merged FC
    server's SGD step after the gradients went out) goes ahead of the tasks waiting in the queue."""
    g = StepGraph(groups={"w0": 1, "w1": 1, "fc": 1}, samples_per_step=2, tasks=(
        Compute(name="h0", group="w0", seconds=0.1),
        Compute(name="h1", group="w1", seconds=0.2),
        Compute(name="f0", group="fc", seconds=1.0, deps=("h0",), queue="fc"),
        Compute(name="u0", group="fc", seconds=0.5, deps=("f0",), queue="fc"),
        Compute(name="f1", group="fc", seconds=1.0, deps=("h1",), queue="fc"),
        Compute(name="u1", group="fc", seconds=0.5, deps=("f1",), queue="fc"),
    ))
    starts = {e.name: e.start_s for e in simulate(g, cluster()).timeline}
    # f1 was waiting since 0.2 s; u0, ready at 1.1 s, still goes first
    assert starts["u0"] == pytest.approx(1.1) and starts["f1"] == pytest.approx(1.6)
    assert starts["u1"] == pytest.approx(2.6)


def mean_field_pair(mean_field: bool) -> StepGraph:
    """Two groups of one node with no common clock, each a second of compute then a second's wait
    an iteration."""
    def build(i):
        out = []
        for g in ("a", "b"):
            prev = (iteration_name(i - 1, f"wait_{g}"),) if i else ()
            out += [Compute(name=iteration_name(i, f"work_{g}"), group=g, seconds=1.0, deps=prev),
                    Delay(name=iteration_name(i, f"wait_{g}"), seconds=1.0, deps=(iteration_name(i, f"work_{g}"),))]
        return out
    return StepGraph(groups={"a": 1, "b": 1}, samples_per_step=2, build=build, iterations=10, mean_field_cores=mean_field)


def test_mean_field_cores_give_each_thread_its_mean_speed():
    """StepGraph.mean_field_cores: on one shared core, the schedule starts both groups together and
    they share the core every second of compute (2 s of compute + 1 s of wait a step). Out of phase,
    each meets the other busy for the share d of the time it computes: speed 1 − d/2, compute
    x = 1/(1 − d/2) with d = x/(x + 1), so x = √2 and the step 1 + √2."""
    one_core = cluster(shared_cores=1)
    assert simulate(mean_field_pair(False), one_core).step_time_s == pytest.approx(3.0)
    pred = simulate(mean_field_pair(True), one_core)
    assert pred.step_time_s == pytest.approx(1 + math.sqrt(2), rel=5e-3)
    assert pred.breakdown["a"]["compute_s"] == pytest.approx(math.sqrt(2), rel=5e-3)
    assert pred.breakdown["a"]["compute_work_s"] == pytest.approx(1.0)  # the work, not its stretched time
    # without shared cores there is nothing to share: the flag changes nothing
    assert simulate(mean_field_pair(True), cluster()).step_time_s == pytest.approx(2.0)


def test_drawn_mean_field_meets_the_threads_the_schedule_has_busy():
    """With a spread, a thread meets the threads the drawn schedule has busy beside it, not the
    others busy independently: two groups whose compute passes one station in turn (a queue) never
    compute at once, so on one shared core each runs at full speed; taken as independent, each
    would meet the other busy for its share of the time and run slower."""
    def build(i):
        out = []
        for g in ("a", "b"):
            prev = (iteration_name(i - 1, f"wait_{g}"),) if i else ()
            out += [Compute(name=iteration_name(i, f"work_{g}"), group=g, seconds=1.0, deps=prev, queue="station"),
                    Delay(name=iteration_name(i, f"wait_{g}"), seconds=0.5, deps=(iteration_name(i, f"work_{g}"),))]
        return out

    def graph(spread):
        return StepGraph(groups={"a": 1, "b": 1}, samples_per_step=2, build=build, iterations=10, mean_field_cores=True,
                         spread=spread, spread_iterations=60 if spread else 0)

    one_core = cluster(shared_cores=1)
    drawn = simulate(graph(0.2), one_core)
    assert drawn.breakdown["a"]["compute_s"] == pytest.approx(drawn.breakdown["a"]["compute_work_s"], rel=1e-3)
    assert drawn.step_time_s == pytest.approx(2.0, rel=0.01)  # the station busy all the time
    independent = simulate(graph(0.0), one_core)
    assert independent.breakdown["a"]["compute_s"] > 1.2 * independent.breakdown["a"]["compute_work_s"]
    assert independent.step_time_s > 1.2 * drawn.step_time_s


def test_mean_field_work_done_for_a_group_never_meets_its_compute():
    """A server's work between two of a group's computes of one iteration (the FC server on its
    batch, between forward and backward) runs while the group waits: the group's thread meets the
    server only in the server's work for the others."""
    def build(i):
        out = []
        for g in ("a", "b"):
            prev = (iteration_name(i - 1, f"bwd_{g}"),) if i else ()
            out += [Compute(name=iteration_name(i, f"fwd_{g}"), group=g, seconds=1.0, deps=prev),
                    Compute(name=iteration_name(i, f"srv_{g}"), group="s", seconds=1.0, queue="s",
                            deps=(iteration_name(i, f"fwd_{g}"),)),
                    Compute(name=iteration_name(i, f"bwd_{g}"), group=g, seconds=1.0, deps=(iteration_name(i, f"srv_{g}"),))]
        return out
    g = StepGraph(groups={"a": 1, "b": 1, "s": 1}, samples_per_step=2, build=build, iterations=12, mean_field_cores=True)
    pred = simulate(g, cluster(shared_cores=1))
    lo, hi = pred.window_s

    def busy(names):  # seconds of the window the named tasks ran (their union)
        spans = sorted((max(e.start_s, lo), min(e.end_s, hi)) for e in pred.timeline
                       if any(e.name.endswith(n) for n in names) and e.end_s > lo and e.start_s < hi)
        total, end = 0.0, lo
        for t0, t1 in spans:
            total += max(0.0, t1 - max(t0, end))
            end = max(end, t1)
        return total

    span = hi - lo
    d_b = busy(["fwd_b", "bwd_b"]) / span
    served = busy(["srv_a"])  # the server's work for a: a waits for it
    d_s = (busy(["srv_a", "srv_b"]) - served) / (span - served)
    # one core: a thread among T busy runs at 1/T; a's own speed, the mean over b and s busy or not
    speed = sum(pb * ps / (1 + nb + ns) for nb, pb in ((0, 1 - d_b), (1, d_b)) for ns, ps in ((0, 1 - d_s), (1, d_s)))
    fwd_a = [e.end_s - e.start_s for e in pred.timeline if e.name.endswith("fwd_a") and lo <= e.start_s < hi]
    assert fwd_a and all(x == pytest.approx(1.0 / speed, rel=0.01) for x in fwd_a)
    # counting s's work for a as well would slow a more: that work never meets a's
    d_all = busy(["srv_a", "srv_b"]) / span
    assert d_all > d_s


def closed_loop(n: int, work_s: float, serve_s: float, spread: float = 0.0) -> StepGraph:
    """n groups of one node, each working on its own, then served by one server in arrival order."""
    def build(i):
        out = []
        for g in range(n):
            prev = (iteration_name(i - 1, f"serve{g}"),) if i else ()
            out += [Compute(name=iteration_name(i, f"work{g}"), group=f"g{g}", seconds=work_s, deps=prev),
                    Compute(name=iteration_name(i, f"serve{g}"), group="s", seconds=serve_s, queue="s",
                            deps=(iteration_name(i, f"work{g}"),))]
        return out
    return StepGraph(groups={**{f"g{g}": 1 for g in range(n)}, "s": 1}, samples_per_step=n, build=build,
                     iterations=8, spread=spread, spread_iterations=64 if spread else 0)


def test_a_spread_costs_a_closed_loop_near_balance_time():
    """StepGraph.spread: four groups whose cycle (3 s of their own, 1 s at the server) is four of the
    server's batches: every iteration alike, nothing waits (a step of 4 s). Drawn with a spread, a
    late group leaves the server idle and an early one waits: the step is longer. Where one station
    is busy all the time (the server, or each group's own work), the draws' mean of exactly 1 in
    the measured window leaves the step as it was."""
    c = cluster()
    assert simulate(closed_loop(4, 3.0, 1.0), c).step_time_s == pytest.approx(4.0)
    spread = simulate(closed_loop(4, 3.0, 1.0, spread=0.25), c)
    assert spread.step_time_s > 4.0 * 1.03
    assert spread.iterations == 64
    assert simulate(closed_loop(4, 3.0, 1.0, spread=0.25), c).step_time_s == spread.step_time_s  # the same draws
    # far from balance: the server is the bottleneck, or never one
    assert simulate(closed_loop(4, 1.0, 1.0, spread=0.25), c).step_time_s == pytest.approx(4.0, rel=0.01)
    assert simulate(closed_loop(4, 20.0, 1.0, spread=0.25), c).step_time_s == pytest.approx(21.0, rel=0.03)
    # each task's times over the measured iterations (the second half): mean as given, spread as asked
    served = [e.end_s - e.start_s for e in spread.timeline
              if e.name.endswith("/serve0") and 32 <= int(e.name[2:e.name.index("/")]) < 64]
    assert len(served) == 32
    assert sum(served) / len(served) == pytest.approx(1.0, rel=1e-9)
    cv = math.sqrt(sum((x - 1.0) ** 2 for x in served) / len(served))
    assert 0.2 < cv < 0.3


def test_the_timeline_plot_draws_the_last_steps_of_a_long_unroll(tmp_path):
    from layerplan import plots

    pred = simulate(closed_loop(4, 3.0, 1.0, spread=0.25), cluster())
    drawn = plots.timeline_entries(pred)
    assert 0 < len(drawn) < len(pred.timeline)
    assert min(e.end_s for e in drawn) > pred.window_s[1] - (plots.TIMELINE_STEPS + 1) * pred.step_time_s
    short = simulate(closed_loop(4, 3.0, 1.0), cluster())
    assert plots.timeline_entries(short) == list(short.timeline)
    plots.timeline_plot(pred, tmp_path / "t.png", "a closed loop")
    assert (tmp_path / "t.png").stat().st_size > 0


def test_a_spread_must_be_a_coefficient_of_variation():
    for bad in (-0.1, 1.5, math.nan, True, "0.2"):
        with pytest.raises(ConfigError, match="spread"):
            closed_loop(2, 1.0, 1.0, spread=bad)
    with pytest.raises(ConfigError, match="spread_iterations"):
        replace(closed_loop(2, 1.0, 1.0), spread_iterations=-1)


def test_async_unrolling_static_form():
    # an asynchronous PS worker: next compute waits only for its own previous pull
    g = StepGraph(groups={"worker": 2, "server": 1}, samples_per_step=2, tasks=(
        Compute(name="c", group="worker", seconds=1.0, deps=("prev/pull",)),
        Transfer(name="push", src="worker", dst="server", bytes_per_flow=GBIT10 * 0.25, pattern="all_to_all", deps=("c",)),
        Transfer(name="pull", src="server", dst="worker", bytes_per_flow=GBIT10 * 0.25, pattern="all_to_all", deps=("push",)),
    ))
    one = simulate(g, cluster())  # k = 1: "prev/" deps are dropped
    assert one.step_time_s == pytest.approx(2.0) and one.iterations == 1
    many = simulate(g, cluster(), iterations=10)
    assert many.step_time_s == pytest.approx(2.0)
    assert many.bytes_sent_per_node["worker"] == pytest.approx(GBIT10 * 0.25)
    assert any(e.name == "it9/pull" for e in many.timeline)


def test_prediction_to_dict_is_json():
    pred = simulate(ps_graph(8, 2, 100e6, t_compute=0.1), cluster(latency=1e-5))
    d = json.loads(json.dumps(pred.to_dict()))
    assert d["step_time_s"] == pytest.approx(pred.step_time_s)
    assert d["bytes_per_step"]["per_role"]["worker"] == pytest.approx(100e6)
    assert d["bytes_per_step"]["wire_per_role_all_nodes"]["worker"] == pytest.approx(800e6)
    assert d["bytes_per_step"]["total"] == pytest.approx(1600e6) == d["bytes_per_step"]["wire_total"]
    # a collective: the runtime counts its payload once per participant, the wire carries more
    g = StepGraph(groups={"w": 4}, samples_per_step=4, tasks=(Collective(name="ar", group="w", scheme="ring", bytes=1e6),))
    dr = simulate(g, cluster()).to_dict()["bytes_per_step"]
    assert dr["per_role"]["w"] == pytest.approx(1e6) and dr["total"] == pytest.approx(4e6)
    assert dr["wire_per_role"]["w"] == pytest.approx(1.5e6) and dr["wire_total"] == pytest.approx(6e6)
    assert dr["wire_per_link"] == {"w->w": pytest.approx(6e6)}
    assert d["breakdown"]["worker"]["compute_s"] == pytest.approx(0.1)
    assert set(d["timeline"][0]) == {"name", "group", "start_s", "end_s", "tag"}
    assert d["throughput_samples_per_s"] == pytest.approx(8 / pred.step_time_s)
    assert set(d["utilization"]) >= {"worker compute", "server NIC ingress"}


def test_graph_errors():
    with pytest.raises(ConfigError, match="not a task of the graph"):
        StepGraph(groups={"w": 1}, samples_per_step=1, tasks=(Compute(name="a", group="w", seconds=1, deps=("b",)),))
    with pytest.raises(ConfigError, match="appears twice"):
        StepGraph(groups={"w": 1}, samples_per_step=1,
                  tasks=(Compute(name="a", group="w", seconds=1), Compute(name="a", group="w", seconds=1)))
    with pytest.raises(ConfigError, match="role 'x'"):
        StepGraph(groups={"w": 1}, samples_per_step=1, tasks=(Compute(name="a", group="x", seconds=1),))
    with pytest.raises(ConfigError, match="at least 1 node"):
        StepGraph(groups={"w": 0}, samples_per_step=1, tasks=(Compute(name="a", group="w", seconds=1),))
    with pytest.raises(ConfigError, match="pattern"):
        Transfer(name="t", src="a", dst="b", bytes_per_flow=1, pattern="mesh")
    with pytest.raises(ConfigError, match="within"):
        Transfer(name="t", src="a", dst="b", bytes_per_flow=1, pattern="within")
    with pytest.raises(ConfigError, match="unknown scheme"):
        Collective(name="c", group="w", scheme="magic", bytes=1)
    with pytest.raises(ConfigError, match="seconds"):
        Compute(name="a", group="w", seconds=-1)
    cyc = StepGraph(groups={"w": 1}, samples_per_step=1, tasks=(
        Compute(name="a", group="w", seconds=1, deps=("b",)), Compute(name="b", group="w", seconds=1, deps=("a",))))
    with pytest.raises(ConfigError, match="cycle"):
        simulate(cyc, cluster())
    flat = StepGraph(groups={"w": 1}, samples_per_step=1, tasks=(Compute(name="a", group="w", seconds=1),))
    with pytest.raises(ConfigError, match="prev/"):
        simulate(flat, cluster(), iterations=4)


@pytest.mark.parametrize("cpu_s_per_byte, ar_end_s, compute_end_s", [
    # 2 nodes on 2 shared cores: a 1 s compute keeps both busy; a 100 MB ring all-reduce at 1 GB/s
    # needs 0.4 cores (2 ends × 1e-10 s/byte on 2S bytes per S of progress), 0.2 for each node's
    # thread. The cores are shared as CFS shares them: each of the 4 threads gets what it needs up
    # to an equal share, so the all-reduce's threads get their 0.2 and the compute threads share the
    # other 1.6. The all-reduce runs at the NIC's rate (0.1 s); the compute does 0.08 s of work in
    # that time and ends at 0.1 + 0.92 = 1.02 s. (Fair in raw rates, the collective would get ~1
    # byte/s until the compute ends: 1.1 s; fair in each activity's own unit, it would stop at the
    # compute threads' fraction of the NIC: 0.12 s.)
    (1e-10, 0.1, 1.02),
    # At 1e-9 s/byte the all-reduce would need 4 cores at the NIC's rate, 2 per thread. CFS gives
    # each of the 4 threads 0.5 of a core: the all-reduce gets 1 core, a quarter of its NIC rate
    # (0.4 s); the compute threads get 0.5 each, do 0.2 s of work by then and end at 1.2 s.
    (1e-9, 0.4, 1.2),
])
def test_a_collective_gets_its_threads_cpu_share_of_busy_shared_cores(cpu_s_per_byte, ar_end_s, compute_end_s):
    c = replace(cluster(bandwidth=1e9, nodes=2, shared_cores=2), comm_cpu_s_per_byte=cpu_s_per_byte)
    g = StepGraph(groups={"w": 2}, samples_per_step=2, tasks=(
        Compute(name="c", group="w", seconds=1.0),
        Collective(name="ar", group="w", scheme="ring", bytes=100e6),
    ))
    ends = {e.name: e.end_s for e in simulate(g, c).timeline}
    assert ends["ar"] == pytest.approx(ar_end_s)
    assert ends["c"] == pytest.approx(compute_end_s)


def test_transfers_share_the_nic_bytewise_when_the_cores_cap_them():
    # Two equal transfers into one node, both capped by their threads' CPU share: they still split
    # the server's ingress evenly, and the two compute threads beside them stay equal too.
    c = replace(cluster(bandwidth=1e9, nodes=3, shared_cores=2), comm_cpu_s_per_byte=1e-9)
    g = StepGraph(groups={"a": 1, "b": 1, "s": 1}, samples_per_step=1, tasks=(
        Compute(name="ca", group="a", seconds=1.0),
        Compute(name="cb", group="b", seconds=1.0),
        Transfer(name="ta", src="a", dst="s", bytes_per_flow=50e6, pattern="all_to_all"),
        Transfer(name="tb", src="b", dst="s", bytes_per_flow=50e6, pattern="all_to_all"),
    ))
    pred = simulate(g, c)
    ends = {e.name: e.end_s for e in pred.timeline}
    assert ends["ta"] == pytest.approx(ends["tb"])
    assert ends["ca"] == pytest.approx(ends["cb"])
    # 6 threads on 2 cores: 1/3 each; each transfer's 2 threads buy 2/3 of a core, 1/3 GB/s
    # (2 ends × 1e-9 s/byte), under the 0.5 GB/s each gets of the server's ingress
    assert ends["ta"] == pytest.approx(50e6 / (1e9 / 3))


def test_groups_report_as_one_role():
    """Two out-of-phase groups of one role: simulated apart, reported as one role (node-weighted
    per-node figures, summed totals), and a bad mapping is refused."""
    tasks = (
        Compute(name="a", group="w0", seconds=1.0),
        Compute(name="b", group="w1", seconds=3.0),
        Transfer(name="ta", src="w0", dst="s", bytes_per_flow=1e9, pattern="spread", deps=("a",)),
        Transfer(name="tb", src="w1", dst="s", bytes_per_flow=1e9, pattern="spread", deps=("b",)),
    )
    apart = simulate(StepGraph(groups={"w0": 1, "w1": 3, "s": 1}, samples_per_step=4, tasks=tasks), cluster())
    merged = simulate(StepGraph(groups={"w0": 1, "w1": 3, "s": 1}, samples_per_step=4, tasks=tasks,
                                report_as={"w0": "worker", "w1": "worker"}), cluster())
    assert merged.step_time_s == apart.step_time_s
    assert merged.groups == {"worker": 4, "s": 1}
    assert merged.breakdown["worker"]["compute_s"] == pytest.approx((1 * 1.0 + 3 * 3.0) / 4)
    assert merged.bytes_sent_per_node["worker"] == pytest.approx(1e9)
    assert merged.bytes_sent_by_role["worker"] == pytest.approx(4e9)
    assert merged.bytes_per_link == {"worker->s": pytest.approx(4e9)}
    assert merged.utilization["worker compute"] == pytest.approx(
        (apart.utilization["w0 compute"] + 3 * apart.utilization["w1 compute"]) / 4)
    assert {e.group for e in merged.timeline} == {"worker", "s"}
    assert not merged.bottleneck.startswith(("w0 ", "w1 "))
    with pytest.raises(ConfigError, match="not a group"):
        StepGraph(groups={"w0": 1}, samples_per_step=1, tasks=tasks[:1], report_as={"x": "worker"})


def test_a_flows_share_weighs_it_against_the_others():
    # two flows of 100 MB from one node at 100 MB/s, shares 2 and 1: the first gets 2/3 of the NIC
    # until it finishes (1.5 s), the second the rest, then the whole NIC (2 s in all)
    g = StepGraph(groups={"src": 1, "a": 1, "b": 1}, samples_per_step=1, tasks=(
        Transfer(name="lead", src="src", dst="a", bytes_per_flow=100e6, pattern="spread", share=2.0),
        Transfer(name="rest", src="src", dst="b", bytes_per_flow=100e6, pattern="spread"),
    ))
    ends = {e.name: e.end_s for e in simulate(g, cluster(bandwidth=100e6)).timeline}
    assert ends["lead"] == pytest.approx(1.5) and ends["rest"] == pytest.approx(2.0)
    for bad in (0.0, -1.0, math.inf, True, "2"):
        with pytest.raises(ConfigError, match="share"):
            Transfer(name="x", src="src", dst="a", bytes_per_flow=1.0, pattern="spread", share=bad)


def test_a_token_bucket_passes_a_burst_at_once_and_refills_while_the_link_idles():
    """LinkSpec.burst_bytes: a message that fits the bucket crosses at once; a longer one passes
    the bucket's bytes at once and the rest at the line rate; the bucket refills with the rate the
    link leaves unused, so a second message after an idle spell passes at once again."""
    base = cluster(bandwidth=1e6, latency=0.0, nodes=2)
    bucket = replace(base, nic=replace(base.nic, burst_bytes=64e3))

    def step(graph, c):
        return simulate(graph, c, iterations=1).step_time_s

    def message(nbytes, deps=(), name="m"):
        return Transfer(name=name, src="a", dst="b", bytes_per_flow=nbytes, pattern="spread", deps=deps)

    small = StepGraph(groups={"a": 1, "b": 1}, samples_per_step=1, tasks=(message(4e3),))
    assert step(small, base) == pytest.approx(4e-3)
    assert step(small, bucket) < 1e-4  # 4 kB of a 64 kB bucket: at once
    big = StepGraph(groups={"a": 1, "b": 1}, samples_per_step=1, tasks=(message(164e3),))
    assert step(big, bucket) == pytest.approx(0.1, rel=0.02)  # 64 kB at once, 100 kB at 1 MB/s
    # two 60 kB messages: back to back the second waits for tokens; 0.1 s apart the bucket has refilled
    back = StepGraph(groups={"a": 1, "b": 1}, samples_per_step=1, tasks=(
        message(60e3), message(60e3, ("m",), "m2")))
    apart = StepGraph(groups={"a": 1, "b": 1}, samples_per_step=1, tasks=(
        message(60e3), Delay(name="idle", seconds=0.1, deps=("m",)), message(60e3, ("idle",), "m2")))
    assert step(back, bucket) > 0.05
    assert step(apart, bucket) == pytest.approx(0.1, rel=0.01)
    with pytest.raises(SpecError, match="burst_bytes"):
        replace(base.nic, burst_bytes=-1.0)

