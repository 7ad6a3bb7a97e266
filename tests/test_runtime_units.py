"""Runtime pieces that need no processes: RunSpec, layout, split, data, metrics, checkpoints."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
import torch.nn as nn

from layerplan.errors import ConfigError, LayerplanError, SpecError
from layerplan.runtime import checkpoint
from layerplan.runtime.commands import attach_prediction
from layerplan.runtime.data import AugmentedDigitsSource, DigitsSource, Sharder, SyntheticSource
from layerplan.runtime.layout import (data_workers, feature_slices, global_batch, layout, nodes_represented, ps_shards,
                                     world_size)
from layerplan.runtime.metrics import summarize
from layerplan.runtime.predict import timeline_marks
from layerplan.runtime.run_spec import RunSpec
from layerplan.runtime.split import disable_dropout, split_module


def spec(**kw):
    d = dict(model="debug", strategy="ps", config={"workers": 2})
    d.update(kw)
    return RunSpec(**d)


# ---- RunSpec -------------------------------------------------------------------------------
def test_runspec_json_round_trip_fills_config_defaults(tmp_path):
    s = spec(strategy="stanza", config={"conv_workers": 4}, steps=7, lr=0.1, data="digits", deterministic=True)
    assert s.config == {"conv_workers": 4, "fc_workers": 1, "split": None, "overlap": True}
    s.save(tmp_path / "s.json")
    assert RunSpec.load(tmp_path / "s.json") == s
    with pytest.raises(ConfigError, match="overlap must be true or false"):
        spec(strategy="stanza", config={"conv_workers": 2, "overlap": "yes"})
    assert RunSpec.from_json(s.to_json()).to_dict() == s.to_dict()


@pytest.mark.parametrize("change, words", [
    ({"colour": 1}, "unknown key"),
    ({"steps": None}, "steps"),
    ({"format": 9}, "format"),
])
def test_runspec_from_dict_is_strict(change, words):
    d = spec().to_dict()
    d.update(change)
    with pytest.raises(SpecError, match=words):
        RunSpec.from_dict(d)
    d = spec().to_dict()
    del d["seed"]
    with pytest.raises(SpecError, match="missing key"):
        RunSpec.from_dict(d)


@pytest.mark.parametrize("kw, err, words", [
    ({"strategy": "gossip"}, ConfigError, "unknown strategy"),
    ({"config": {"workers": 0}}, ConfigError, "workers must be at least 1"),
    ({"config": {"workers": 2, "servers": 2, "colour": 1}}, ConfigError, "unknown config key"),
    ({"strategy": "allreduce", "config": {"workers": 2, "servers": 1}}, ConfigError, "servers"),
    ({"strategy": "stanza", "config": {"fc_workers": 1}}, ConfigError, "conv_workers"),
    ({"strategy": "ralp", "config": {"workers": 2, "ralp_setting": "X"}}, ConfigError, "ralp_setting"),
    ({"strategy": "hybrid", "config": {"conv_workers": 2, "fc_workers": 0}}, ConfigError, "fc_workers must be at least 1"),
    ({"strategy": "hybrid", "config": {"conv_workers": 2, "replicate": "fc2"}}, ConfigError, "list of fc layer names"),
    ({"strategy": "hybrid", "config": {"conv_workers": 2, "replicate": ["fc2", "fc2"]}}, ConfigError, "twice"),
    ({"strategy": "hybrid", "config": {"fc_workers": 2}}, ConfigError, "conv_workers"),
    ({"batch_size": 0}, SpecError, "batch_size"),
    ({"momentum": 1.0}, SpecError, "momentum"),
    ({"lr": -1.0}, SpecError, "lr"),
    ({"data": "cifar"}, SpecError, "data"),
    ({"resume": True}, SpecError, "checkpoint_dir"),
    ({"backend": "mpi"}, SpecError, "backend"),
    ({"strategy": "groups", "config": {"machines": 4, "groups": 3}}, ConfigError, "do not divide 4 conv machines"),
    ({"strategy": "groups", "config": {"machines": 4, "groups": 0}}, ConfigError, "groups must be at least 1"),
    ({"strategy": "groups", "config": {"machines": 4}}, ConfigError, "needs 'groups'"),
    ({"strategy": "groups", "config": {"machines": 2, "groups": 1, "pipelined": True}}, ConfigError,
     "pipelined runs .* not implemented"),
    ({"strategy": "groups", "config": {"machines": 2, "groups": 1}, "checkpoint_dir": "/tmp/x",
      "checkpoint_every": 2}, ConfigError, "only after the last step"),
    ({"checkpoint_dir": "/tmp/x", "resume": True, "init_from": "/tmp/y"}, SpecError, "set one of them"),
    ({"init_from": ""}, SpecError, "init_from"),
])
def test_runspec_rejects_bad_values(kw, err, words):
    with pytest.raises(err, match=words):
        spec(**kw)


# ---- layout --------------------------------------------------------------------------------
def test_layouts():
    ps = layout(spec(config={"workers": 3, "servers": 2}))
    assert [r.kind for r in ps.values()] == ["worker"] * 3 + ["server"] * 2
    assert ps[0].peers == (3, 4) and ps[4].peers == (0, 1, 2) and ps[4].index == 1
    st = layout(spec(strategy="stanza", config={"conv_workers": 5, "fc_workers": 2}))
    assert [r.kind for r in st.values()] == ["conv_worker"] * 5 + ["fc_worker"] * 2
    assert st[5].peers == (0, 1) and st[6].peers == (2, 3, 4)  # contiguous blocks
    assert [st[i].peers for i in range(5)] == [(5,), (5,), (6,), (6,), (6,)]
    ra = spec(strategy="ralp", config={"workers": 3, "ralp_setting": "H"})
    assert [r.kind for r in layout(ra).values()] == ["worker"] * 3 + ["ps_worker"]
    assert world_size(ra) == 4 and nodes_represented(ra) == 6 and data_workers(ra) == 3
    assert nodes_represented(ra.replace(config={"workers": 3, "ralp_setting": "N"})) == 4
    assert global_batch(spec(strategy="allreduce", config={"workers": 3}, batch_size=5)) == 15


def test_hybrid_spec_and_layout():
    s = spec(strategy="hybrid", config={"conv_workers": 3, "fc_workers": 2})
    assert s.config == {"conv_workers": 3, "fc_workers": 2, "replicate": [], "split": None}
    assert RunSpec.from_json(s.to_json()) == s
    h = layout(s)
    assert [r.kind for r in h.values()] == ["conv_worker"] * 3 + ["fc_worker"] * 2
    assert h[3].peers == (0,) and h[4].peers == (1, 2)  # batch-layout rows: contiguous blocks of CONV workers
    assert [h[i].peers for i in range(3)] == [(3, 4), (4, 3), (4, 3)]  # own FC machine first
    assert data_workers(s) == 3 and world_size(s) == 5
    more = layout(s.replace(config={"conv_workers": 2, "fc_workers": 3}))  # an FC machine without rows is fine
    assert more[2].peers == () and more[3].peers == (0,) and more[4].peers == (1,)
    assert feature_slices(10, 3) == [(0, 3), (3, 6), (6, 10)]
    with pytest.raises(ConfigError, match="cannot partition 2 output features over 3"):
        feature_slices(2, 3)


def test_merge_slices_rebuilds_partitioned_parameters():
    from layerplan.runtime.reference import merge_slices

    w = torch.arange(12.0).reshape(4, 3)
    got = merge_slices({"a.weight[2:4]": w[2:], "a.weight[0:2]": w[:2], "b": torch.ones(1)})
    assert set(got) == {"a.weight", "b"} and torch.equal(got["a.weight"], w)
    with pytest.raises(ValueError, match="do not tile"):
        merge_slices({"a.weight[0:2]": w[:2], "a.weight[3:4]": w[3:]})


HYBRID_NETS = '''
import torch.nn as nn

def log_softmax_head():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 8), nn.ReLU(),
                         nn.Linear(8, 6), nn.LogSoftmax(dim=1))
'''


def test_hybrid_phase_blocks_and_errors(tmp_path):
    from layerplan.runtime.model import hybrid_phase, resolve

    def phase(model="debug", input_size=None, **config):
        s = spec(model=model, strategy="hybrid", config={"conv_workers": 2, **config}, input_size=input_size)
        return hybrid_phase(s, resolve(s)[0])

    p = phase(fc_workers=2, replicate=["fc2"])
    assert p.conv_end == "flatten"
    assert [(b.fc, b.layers, b.partitioned) for b in p.blocks] == [("fc1", ("fc1", "relu3"), True),
                                                                  ("fc2", ("fc2",), False)]
    assert not any(b.partitioned for b in phase(fc_workers=1).blocks)  # one FC machine: whole layers
    a = phase("alexnet_cifar", fc_workers=2)
    assert a.conv_end == "classifier.0"  # the dropout before the first fc layer runs with the conv phase
    assert [b.fc for b in a.blocks] == ["classifier.1", "classifier.4", "classifier.6"]
    with pytest.raises(ConfigError, match="'fc9', not an fc layer"):
        phase(fc_workers=2, replicate=["fc9"])
    with pytest.raises(ConfigError, match="hybrid needs an FC phase"):
        phase("nin", fc_workers=2)
    f = tmp_path / "nets.py"
    f.write_text(HYBRID_NETS)
    model = f"{f}:log_softmax_head"
    with pytest.raises(ConfigError, match="'6' \\(LogSoftmax\\) after '5' is not element-wise"):
        phase(model, 8, fc_workers=2)
    assert [b.partitioned for b in phase(model, 8, fc_workers=2, replicate=["5"]).blocks] == [True, False]
def test_groups_layout_mirrors_the_engine_nodes():
    s = spec(strategy="groups", config={"machines": 6, "groups": 3}, batch_size=4)
    assert s.config == {"machines": 6, "groups": 3, "split": None, "pipelined": False}
    ro = layout(s)
    assert [r.kind for r in ro.values()] == ["conv_machine"] * 6 + ["fc_server", "conv_model_server"]
    assert [ro[r].group for r in range(6)] == [0, 0, 1, 1, 2, 2]  # contiguous groups of k = 2
    assert all(ro[r].peers == (6, 7) and ro[r].data_index == r for r in range(6))
    assert ro[6].peers == ro[7].peers == tuple(range(6))
    assert world_size(s) == nodes_represented(s) == 8 and data_workers(s) == 6 and global_batch(s) == 24
    from layerplan import strategies

    eng = strategies.get("groups")
    cfg = eng.Config(machines=6, groups=3)
    assert eng.nodes_needed(cfg) == world_size(s) and sum(eng.roles(cfg).values()) == world_size(s)


def test_staleness_summary_and_async_losses():
    from layerplan.runtime.roles.groups import staleness_summary

    recs = [{"order": i, "group": i % 2, "iteration": i // 2, "staleness": v} for i, v in enumerate([0, 1, 1, 1, 2])]
    st = staleness_summary(recs, 2)
    assert st["median"] == 1 and st["mean"] == 1.0 and st["max"] == 2 and st["expected"] == 1
    assert st["histogram"] == {"0": 1, "1": 3, "2": 1} and st["per_update"] == recs
    s = spec(strategy="groups", config={"machines": 2, "groups": 2}, warmup_steps=0)
    rec = {"wall_s": 1.0, "compute_s": 0.5, "comm_s": 0.5, "sent_bytes": 1, "recv_bytes": 1, "loss": None}
    frags = [{"rank": r, "kind": k, "checkpoint_bytes_sent": 0, "records": [dict(rec, step=i) for i in range(2)]}
             for r, k in [(0, "conv_machine"), (1, "conv_machine"), (3, "conv_model_server")]]
    frags.append({"rank": 2, "kind": "fc_server", "checkpoint_bytes_sent": 0, "records": [dict(rec, step=i) for i in (0, 1)],
                  "step_losses": {0: 1.0, 1: 0.5}, "extra": {"group_updates": [1, 2]}})
    m = summarize(frags, s, layout(s), 4, 4)
    assert m["loss"] == [1.0, 0.5] and m["group_updates"] == [1, 2]


def test_groups_step_time_is_the_round_time_of_their_throughput():
    """Asynchronous groups: each group's mean iteration (the mean of its machines' walls) after the
    two warm-up steps, combined as throughputs — not the median of the slowest rank's steps, which
    would take the slower of two out-of-phase groups every step, nor a group's slowest machine per
    step, which takes the long side of its machines' jitter."""
    s = spec(strategy="groups", config={"machines": 4, "groups": 2}, batch_size=2)
    assert s.warmup_steps == 2 and spec(config={"workers": 2}).warmup_steps == 1

    def frag(rank, kind, walls):
        return {"rank": rank, "kind": kind, "checkpoint_bytes_sent": 0, "records": [
            {"step": i, "wall_s": w, "compute_s": 0.0, "comm_s": w, "sent_bytes": 1, "recv_bytes": 1, "loss": None}
            for i, w in enumerate(walls)]}

    # group 0 (ranks 0, 1): its machines' step ends jitter out of phase (1 s / 3 s, 2 s a step each);
    # group 1 (ranks 2, 3) alternates 3 s / 1 s in phase; the servers' steps are whatever arrivals came
    # next (left out); the first two steps are warm-up
    frags = [frag(0, "conv_machine", [9, 9, 1, 3, 1, 3]), frag(1, "conv_machine", [9, 9, 3, 1, 3, 1]),
             frag(2, "conv_machine", [9, 9, 3, 1, 3, 1]), frag(3, "conv_machine", [9, 9, 3, 1, 3, 1]),
             frag(4, "fc_server", [9, 9, 5, 5, 5, 5]), frag(5, "conv_model_server", [9, 9, 5, 5, 5, 5])]
    m = summarize(frags, s, layout(s), 6, 8)
    assert m["step_time_s"] == pytest.approx(2.0)  # both groups: 2 s per iteration on average
    assert m["throughput_samples_per_s"] == pytest.approx(4.0)
    frags[2] = frags[3] = frag(2, "conv_machine", [9, 9, 4, 4, 4, 4])  # group 1 at 4 s: 1/(½·(1/2 + 1/4)) s a round
    assert summarize(frags, s, layout(s), 6, 8)["step_time_s"] == pytest.approx(1 / (0.5 * (1 / 2 + 1 / 4)))
    assert m["step_times_s"][2] == pytest.approx((1 + 3 + 3 + 3 + 5 + 5) / 6)  # the per-step record: every rank's mean


def test_groups_round_time_leaves_out_the_tail_after_the_first_group_finished():
    """Every group runs the same number of iterations out of phase: once the first group is done, the
    others' last iterations share the cores with fewer groups and run fast. A group's steps that
    ended after the first group's last are not steady state and are left out; without end times
    (records of an older layerplan) every measured step counts."""
    s = spec(strategy="groups", config={"machines": 2, "groups": 2}, batch_size=2)

    def frag(rank, walls, start, ends=True):
        out, t = [], start
        for i, w in enumerate(walls):
            t += w
            out.append({"step": i, "wall_s": w, "compute_s": 0.0, "comm_s": w, "sent_bytes": 1, "recv_bytes": 1,
                        "loss": None, **({"end_s": t} if ends else {})})
        return {"rank": rank, "kind": "conv_machine", "checkpoint_bytes_sent": 0, "records": out}

    # group 0's steps end at 101 102 105 108 111 (two warm-up steps, then 3 s each); group 1 runs a
    # step behind, its steps end at 102 104 107 110 111.5: its last, 1.5 s with group 0 done, is left out
    servers = [frag(2, [9] * 5, 100.0), frag(3, [9] * 5, 100.0)]
    g0 = frag(0, [1, 1, 3, 3, 3], 100.0)
    g1 = frag(1, [2, 2, 3, 3, 1.5], 100.0)
    m = summarize([g0, g1, *servers], s, layout(s), 4, 4)
    assert m["step_time_s"] == pytest.approx(3.0)  # both groups 3 s an iteration in the steady window
    old = [frag(0, [1, 1, 3, 3, 3], 100.0, ends=False), frag(1, [2, 2, 3, 3, 1.5], 100.0, ends=False), *servers]
    assert summarize(old, s, layout(s), 4, 4)["step_time_s"] == pytest.approx(2 / (1 / 3 + 1 / 2.5))


def test_predict_merges_the_engines_groups_into_conv_machines():
    from layerplan.runtime.predict import predict_run

    for g in (1, 2, 4):
        p = predict_run(spec(strategy="groups", config={"machines": 4, "groups": g}, batch_size=3))
        assert p["groups"] == {"conv_machine": 4, "fc_server": 1, "conv_model_server": 1}
        assert set(p["breakdown"]) == set(p["bytes_per_step"]["per_role"]) == set(p["groups"])
        assert p["samples_per_step"] == 12 and p["step_time_s"] > 0
        assert p["config"] == {"machines": 4, "groups": g, "merged_fc": True, "pipelined": False}


def test_layout_rejects_nonsense():
    with pytest.raises(ConfigError, match="fc_workers <= conv_workers"):
        layout(spec(strategy="stanza", config={"conv_workers": 1, "fc_workers": 2}))
    with pytest.raises(ConfigError, match="more than makes sense"):
        layout(spec(strategy="allreduce", config={"workers": 500}))
    with pytest.raises(ConfigError, match="more servers than parameters"):
        ps_shards(3, 4)


def test_ps_shards_are_contiguous_and_balanced():
    for total, n in [(10, 3), (1106, 2), (7, 7), (1_000_003, 5)]:
        sh = ps_shards(total, n)
        assert sh[0][0] == 0 and sh[-1][1] == total
        assert all(a[1] == b[0] for a, b in zip(sh, sh[1:]))
        sizes = [b - a for a, b in sh]
        assert max(sizes) - min(sizes) <= 1


# ---- split ---------------------------------------------------------------------------------
class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Linear(4 * 4 * 4, 8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(4, 3)
        self.scale = nn.Parameter(torch.tensor(2.0))  # read by the tail through get_attr

    def forward(self, x):
        x = self.relu(self.conv1(x))
        y = self.relu(self.conv2(x))
        return self.fc(torch.flatten((x + y).mean((2, 3)), 1)) * self.scale


def test_split_is_exact_and_shares_parameters():
    m = Small().eval()
    s = split_module(m, "flatten")
    x = torch.randn(5, 3, 8, 8)
    assert torch.equal(s.tail(s.head(x)), m(x))
    assert s.head.get_submodule("features.0").weight is m.features[0].weight
    assert s.tail.get_submodule("classifier.3").bias is m.classifier[3].bias
    assert {n for n, _ in s.head.named_parameters()} | {n for n, _ in s.tail.named_parameters()} == \
        {n for n, _ in m.named_parameters()}


def test_split_of_a_dag_and_repeated_module_names():
    m = Residual()
    x = torch.randn(2, 3, 6, 6)
    for layer in ("add", "mean", "flatten", "relu_1"):
        if layer == "relu_1":
            with pytest.raises(ConfigError, match="not a single cut"):
                split_module(m, layer)  # the residual input x still crosses
            continue
        s = split_module(m, layer)
        assert torch.equal(s.tail(s.head(x)), m(x))
    assert any(n == "scale" for n, _ in split_module(m, "add").tail.named_parameters())


@pytest.mark.parametrize("layer, words", [("conv2", "not a single cut"), ("nope", "not a layer"),
                                          ("mul", "last layer")])
def test_split_errors(layer, words):
    with pytest.raises(ConfigError, match=words):
        split_module(Residual(), layer)


def test_disable_dropout():
    m = Small()
    assert disable_dropout(m) == 1 and m.classifier[0].p == 0.0


# ---- data ----------------------------------------------------------------------------------
def test_synthetic_is_a_function_of_seed_and_index():
    a, b = SyntheticSource((3, 4, 4), 10, seed=1), SyntheticSource((3, 4, 4), 10, seed=1)
    assert torch.equal(a.inputs([5, 9]), b.inputs([5, 9]))
    assert torch.equal(a.inputs([9])[0], b.inputs([5, 9])[1])
    assert not torch.equal(a.inputs([5]), SyntheticSource((3, 4, 4), 10, seed=2).inputs([5]))
    y = a.labels(list(range(200)))
    assert y.min() >= 0 and y.max() < 10 and len(set(y.tolist())) == 10


def test_sharding_union_is_the_global_batch_and_epochs_permute():
    src = DigitsSource((3, 16, 16), 10)
    assert src.size == 1797
    sh = Sharder(src, workers=3, batch_size=7, seed=4)
    x, y = sh.global_batch(2)
    parts = [sh.batch(2, w) for w in range(3)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x) and torch.equal(torch.cat([p[1] for p in parts]), y)
    assert x.shape == (21, 3, 16, 16) and torch.equal(x[:, 0], x[:, 2])
    assert abs(float(x.mean())) < 0.5
    assert sh.indices(2, 0) == Sharder(DigitsSource((3, 16, 16), 10), 3, 7, 4).indices(2, 0)  # deterministic
    steps_per_epoch = 1797 // 21 + 1
    first_epoch = [i for s in range(steps_per_epoch) for w in range(3) for i in sh.indices(s, w)][:1797]
    assert sorted(first_epoch) == list(range(1797))  # every sample once per epoch
    assert sh.position(steps_per_epoch) == {"step": steps_per_epoch, "sample": steps_per_epoch * 21,
                                            "epoch": 1, "offset": steps_per_epoch * 21 - 1797}
    assert torch.equal(sh.labels(3, 1), sh.batch(3, 1)[1])


def test_augmented_digits_transform_each_stream_position_its_own_way():
    src = AugmentedDigitsSource((3, 16, 16), 10, seed=4)
    plain = DigitsSource((3, 16, 16), 10)
    sh = Sharder(src, workers=2, batch_size=5, seed=4)
    x, y = sh.global_batch(3)
    assert x.shape == (10, 3, 16, 16) and torch.equal(x[:, 0], x[:, 1])
    assert torch.equal(y, Sharder(plain, 2, 5, 4).global_batch(3)[1])  # the same samples, labels unchanged
    assert torch.equal(x, Sharder(AugmentedDigitsSource((3, 16, 16), 10, seed=4), 2, 5, 4).global_batch(3)[0])
    assert torch.equal(torch.cat([sh.inputs(3, 0), sh.inputs(3, 1)]), x)  # a worker's part is its slice
    idx = sh.indices(3, 0)
    assert not torch.allclose(x[:5], plain.inputs(idx), atol=0.1)  # transformed
    # the same sample at another stream position (a later epoch) is transformed another way
    assert not torch.equal(src.inputs(idx[:1], [0]), src.inputs(idx[:1], [1797]))
    # blank stays blank: the background outside the digit is the normalised zero pixel
    assert abs(float(x.min()) - float(plain.inputs(list(range(50))).min())) < 1e-5
    angle, scale, dx, dy = zip(*src.params(range(2000)))
    assert max(map(abs, angle)) <= math.radians(src.ROTATE_DEG) and min(scale) >= 1 - src.SCALE
    assert max(map(abs, dx + dy)) <= src.SHIFT_PX and min(angle) < -0.9 * math.radians(src.ROTATE_DEG)


def test_digits_rejects_unfit_networks():
    with pytest.raises(ConfigError, match="10 classes"):
        DigitsSource((3, 8, 8), 5)
    with pytest.raises(ConfigError, match="image network"):
        DigitsSource((64,), 10)


# ---- metrics -------------------------------------------------------------------------------
def test_summarize_medians_roles_and_losses():
    s = spec(config={"workers": 2}, warmup_steps=1)
    roles = layout(s)

    def frag(rank, kind, sent, loss, walls):
        return {"rank": rank, "kind": kind, "checkpoint_bytes_sent": 0, "records": [
            {"step": i, "wall_s": w, "compute_s": w / 2, "comm_s": w / 4, "cpu_s": w * (0.25 if loss is None else 0.5),
             "sent_bytes": sent, "recv_bytes": sent, "loss": loss} for i, w in enumerate(walls)]}

    # the workers' step ends jitter out of phase (1 s / 3 s): a step is the ranks' mean wall (2 s), not
    # the slowest rank's 3 s
    m = summarize([frag(2, "server", 200, None, [9, 2, 2, 2]), frag(0, "worker", 100, 0.5, [9, 1, 3, 1]),
                   frag(1, "worker", 100, 0.25, [9, 3, 1, 1])], s, roles, 3, 64)
    assert m["step_time_s"] == 2 and m["throughput_samples_per_s"] == 32
    assert m["step_times_s"] == pytest.approx([9, 2, 2, 4 / 3])
    assert m["loss"] == [0.75] * 4
    assert m["bytes_per_step"]["per_role"] == {"worker": 100, "server": 200}
    assert m["bytes_per_step"]["total"] == 400
    assert m["breakdown"]["server"] == {"compute_s": 1.0, "comm_s": 0.5, "cpu_cores": 0.25}
    assert m["breakdown"]["worker"]["cpu_cores"] == 0.5
    assert m["cpu_cores_busy"] == pytest.approx(1.25)  # two workers at half a core, the server at a quarter
    assert m["bottleneck"] == "server" and m["steps"] == [0, 3] and m["roles"] == {"0": "worker", "1": "worker",
                                                                                  "2": "server"}
    json.dumps(m)


def test_summarize_times_each_roles_marks_where_every_rank_reached_them():
    s = spec(config={"conv_workers": 2, "fc_workers": 1}, strategy="stanza", warmup_steps=1)
    roles = layout(s)

    def frag(rank, kind, marks, wall_s=1.0):  # step i ends at 10·i + 1 s; marks: seconds after 10·i
        return {"rank": rank, "kind": kind, "checkpoint_bytes_sent": 0, "records": [
            {"step": i, "wall_s": wall_s, "compute_s": 0.5, "comm_s": 0.1, "cpu_s": 0.5, "sent_bytes": 1,
             "recv_bytes": 1, "loss": None, "end_s": 10.0 * i + 1.0, "marks": {k: 10.0 * i + t for k, t in mk.items()}}
            for i, mk in enumerate(marks)]}

    conv0 = [{"conv_fwd": 9.0, "act_grads": 9.5}, {"conv_fwd": 0.2, "act_grads": 0.5}, {"conv_fwd": 0.4, "act_grads": 0.7},
             {"conv_fwd": 0.3, "act_grads": 0.6}]  # the warm-up step's 9 s is left out: medians 0.3 and 0.6
    conv1 = [{"conv_fwd": 9.0}, {"conv_fwd": 0.5}, {"conv_fwd": 0.5}, {"conv_fwd": 0.5}]  # never reached act_grads
    # the FC worker began each step 0.5 s before the CONV workers (it waits for them): their start is the step's
    fc = [{"activations": 0.3}] * 4
    m = summarize([frag(0, "conv_worker", conv0), frag(1, "conv_worker", conv1),
                   frag(2, "fc_worker", fc, wall_s=1.5)], s, roles, 3, 32)
    assert m["breakdown"]["conv_worker"]["marks_s"] == {"conv_fwd": pytest.approx(0.4)}  # mean of 0.3 and 0.5
    assert m["breakdown"]["fc_worker"]["marks_s"] == {"activations": pytest.approx(0.3)}
    # CONV worker 1 starts each step 20 ms after worker 0: the step starts at their mean start, 10 ms in
    m = summarize([frag(0, "conv_worker", conv0), frag(1, "conv_worker", conv1, wall_s=0.98),
                   frag(2, "fc_worker", fc, wall_s=1.5)], s, roles, 3, 32)
    assert m["breakdown"]["conv_worker"]["marks_s"] == {"conv_fwd": pytest.approx(0.39)}  # 0.3 and 0.48 from their own
    assert m["breakdown"]["fc_worker"]["marks_s"] == {"activations": pytest.approx(0.29)}
    # FC workers that sum their gradients at their step's end start it after the CONV workers
    # (small batches): the step still starts with the CONV workers, whose tasks open the schedule
    m = summarize([frag(0, "conv_worker", conv0), frag(1, "conv_worker", conv1),
                   frag(2, "fc_worker", fc, wall_s=0.6)], s, roles, 3, 32)
    assert m["breakdown"]["conv_worker"]["marks_s"] == {"conv_fwd": pytest.approx(0.4)}
    assert m["breakdown"]["fc_worker"]["marks_s"] == {"activations": pytest.approx(0.3)}
    # without every rank's step end times there is no common start: no marks
    plain = summarize([{**frag(0, "conv_worker", conv0), "records": [{k: v for k, v in r.items() if k != "end_s"}
                                                                     for r in frag(0, "conv_worker", conv0)["records"]]},
                       frag(1, "conv_worker", conv1), frag(2, "fc_worker", fc, wall_s=1.5)], s, roles, 3, 32)
    assert all("marks_s" not in b for b in plain["breakdown"].values())
    pred = {"timeline": [{"name": "conv_fwd", "group": "conv_worker", "start_s": 0.0, "end_s": 0.32, "tag": ""},
                         {"name": "conv_fwd", "group": "conv_worker", "start_s": 0.0, "end_s": 0.35, "tag": ""},
                         {"name": "conv_fwd", "group": "fc_worker", "start_s": 0.0, "end_s": 9.0, "tag": ""},
                         {"name": "fc_update", "group": "fc_worker", "start_s": 0.5, "end_s": 0.6, "tag": ""}]}
    assert timeline_marks(pred, {k: b["marks_s"] for k, b in m["breakdown"].items()}) == {
        "conv_worker": {"conv_fwd": 0.35}}  # the fc_worker's row has no activations task
    # a task simulated per group of nodes (ps's staggered workers) counts under its own name
    staggered = {"timeline": [{"name": "fwd_bwd@worker0", "group": "worker", "start_s": 0.0, "end_s": 0.9, "tag": ""},
                              {"name": "fwd_bwd@worker1", "group": "worker", "start_s": 0.0, "end_s": 1.1, "tag": ""}]}
    assert timeline_marks(staggered, {"worker": {"fwd_bwd": 1.0}}) == {"worker": {"fwd_bwd": 1.1}}
    # ... on a role of several nodes, the mean of their ends (as a run's mark is its ranks' mean);
    # on a role of one node that serves the others in turn, its last
    served = {"groups": {"worker": 2, "ps_worker": 1}, "timeline": [
        *staggered["timeline"],
        {"name": "tail@worker0", "group": "ps_worker", "start_s": 0.9, "end_s": 1.0, "tag": ""},
        {"name": "tail@worker1", "group": "ps_worker", "start_s": 1.0, "end_s": 1.2, "tag": ""}]}
    assert timeline_marks(served, {"worker": {"fwd_bwd": 1.0}, "ps_worker": {"tail": 1.0}}) == {
        "worker": {"fwd_bwd": pytest.approx(1.0)}, "ps_worker": {"tail": 1.2}}
    # several iterations: the last, from its first start
    rounds = {"timeline": [{"name": f"it{i}/{n}", "group": "server", "start_s": 2.0 * i + a, "end_s": 2.0 * i + b, "tag": ""}
                           for i in range(3) for n, a, b in (("push", 0.25, 1.0), ("update", 1.0, 1.5))]}
    assert timeline_marks(rounds, {"server": {"update": 1.4}}) == {"server": {"update": pytest.approx(1.25)}}
    # ... from the mean start of the opening role's nodes, as a run's step starts at its ranks' mean:
    # workers whose pulls came in one after another start 0.0 and 0.2 into the iteration
    staggered_rounds = {"groups": {"worker": 2, "ps_worker": 1}, "timeline": [
        {"name": f"it{i}/{n}@worker{j}", "group": g, "start_s": 2.0 * i + a + 0.2 * j, "end_s": 2.0 * i + b + 0.2 * j,
         "tag": ""} for i in range(2) for j in range(2)
        for n, g, a, b in (("head_fwd", "worker", 0.0, 0.5), ("tail", "ps_worker", 0.5, 0.7))]}
    assert timeline_marks(staggered_rounds, {"worker": {"head_fwd": 0.5}, "ps_worker": {"tail": 0.8}}) == {
        "worker": {"head_fwd": pytest.approx(0.5)}, "ps_worker": {"tail": pytest.approx(0.8)}}


def test_a_server_sums_the_pushed_gradients_in_their_order():
    import torch

    from layerplan.runtime.roles import summed

    bufs = [torch.randn(1000, dtype=torch.float64) * 10.0 ** k for k in range(5)]
    out = torch.empty(1000, dtype=torch.float64)
    assert summed(bufs[:1], out) is bufs[0]  # one gradient is used as it came
    ref = bufs[0].clone()
    for b in bufs[1:]:
        ref += b
    assert summed(bufs, out) is out and torch.equal(out, ref)  # bit for bit the sum added one by one


def test_meter_counts_the_process_cpu_time_of_a_step():
    from layerplan.runtime.metrics import Meter

    meter = Meter(0, "worker")
    meter.start_step(0)
    end = time.process_time() + 0.05
    while time.process_time() < end:  # busy: CPU time goes with the wall
        pass
    busy = meter.end_step()
    meter.start_step(1)
    time.sleep(0.05)  # blocked, as in a wait(): the wall goes on, the CPU time does not
    idle = meter.end_step()
    assert busy["cpu_s"] >= 0.05 and idle["wall_s"] >= 0.05
    assert idle["cpu_s"] < busy["cpu_s"] / 2


def test_attach_prediction_puts_both_side_by_side():
    m = {"step_time_s": 2.0, "throughput_samples_per_s": 32.0,
         "bytes_per_step": {"total": 400, "per_role": {"worker": 100}},
         "breakdown": {"worker": {"compute_s": 1.0, "comm_s": 0.5}}}
    p = {"step_time_s": 2.5, "throughput_samples_per_s": 25.6, "bytes_per_step": {"total": 400},
         "breakdown": {"worker": {"compute_s": 0.5}}, "bottleneck": "worker"}
    out = attach_prediction(m, p)
    assert out["prediction"] is p
    assert out["comparison"]["step_time_s"] == {"measured": 2.0, "predicted": 2.5, "rel_error": 0.25}
    assert out["comparison"]["bytes_per_step.total"]["rel_error"] == 0.0
    assert out["comparison"]["breakdown.worker.compute_s"]["rel_error"] == -0.5
    assert "breakdown.worker.comm_s" not in out["comparison"]
    assert "cpu_cores_busy" not in out["comparison"]  # a cluster without shared cores
    shared = {**p, "cluster": {"shared_cores": 2}, "utilization": {"shared cores": 0.75}}
    out = attach_prediction({**m, "cpu_cores_busy": 1.2}, shared)
    assert out["comparison"]["cpu_cores_busy"]["predicted"] == 1.5  # 75% of the 2 cores
    assert out["comparison"]["cpu_cores_busy"]["rel_error"] == pytest.approx(0.25)
    marked = {**m, "breakdown": {"worker": {"compute_s": 1.0, "comm_s": 0.5, "marks_s": {"fwd": 0.4, "unbucket": 1.5}}}}
    timeline = [{"name": "fwd", "group": "worker", "start_s": 0.0, "end_s": 0.5, "tag": ""}]
    out = attach_prediction(marked, {**p, "timeline": timeline})
    assert out["comparison"]["marks_s.worker.fwd"]["rel_error"] == pytest.approx(0.25)
    assert "marks_s.worker.unbucket" not in out["comparison"]  # the timeline has no such task


# ---- checkpoint files ----------------------------------------------------------------------
def test_atomic_writes_leave_no_temporaries(tmp_path):
    checkpoint.atomic_write_json(tmp_path / "latest.json", {"step": 3})
    checkpoint.atomic_torch_save({"w": torch.ones(2)}, tmp_path / "ckpt-rank0.pt")
    checkpoint.atomic_write_json(tmp_path / "latest.json", {"step": 4})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-rank0.pt", "latest.json"]
    assert checkpoint.latest(tmp_path) == {"step": 4}
    assert checkpoint.latest(tmp_path / "none") is None


def test_resume_checks(tmp_path):
    s = spec(checkpoint_dir=str(tmp_path), resume=True, steps=10)
    with pytest.raises(ConfigError, match="nothing to resume"):
        checkpoint.check_resume(s, 3)
    checkpoint.atomic_write_json(tmp_path / "latest.json", {"step": 4, "dir": "step-00000004", "world_size": 3,
                                                            "spec": s.replace(seed=9).to_dict()})
    with pytest.raises(ConfigError, match="seed"):
        checkpoint.check_resume(s, 3)
    checkpoint.atomic_write_json(tmp_path / "latest.json", {"step": 4, "dir": "step-00000004", "world_size": 3,
                                                            "spec": s.replace(steps=4, lr=0.5).to_dict()})
    assert checkpoint.check_resume(s, 3)["step"] == 4
    with pytest.raises(ConfigError, match="nothing to do"):
        checkpoint.check_resume(s.replace(steps=4), 3)
    assert isinstance(ConfigError("x"), LayerplanError)


def test_init_from_checks_allow_another_config_but_not_other_roles(tmp_path):
    src = spec(strategy="groups", config={"machines": 2, "groups": 1}, steps=3)
    kinds = [r.kind for _, r in sorted(layout(src).items())]
    checkpoint.atomic_write_json(tmp_path / "latest.json", {"step": 3, "dir": "step-00000003", "world_size": 4,
                                                            "kinds": kinds, "spec": src.to_dict()})
    other = src.replace(config={"machines": 2, "groups": 2}, steps=6, lr=0.5, momentum=0.3, init_from=str(tmp_path))
    assert checkpoint.check_resume(other, 4, layout(other))["step"] == 3  # groups, lr and momentum may change
    with pytest.raises(ConfigError, match="different config"):  # resume keeps the config
        checkpoint.check_resume(other.replace(init_from=None, checkpoint_dir=str(tmp_path), resume=True), 4)
    with pytest.raises(ConfigError, match="other roles"):
        checkpoint.atomic_write_json(tmp_path / "latest.json", {"step": 3, "dir": "step-00000003", "world_size": 4,
                                                                "kinds": kinds[::-1], "spec": src.to_dict()})
        checkpoint.check_resume(other, 4, layout(other))
    with pytest.raises(ConfigError, match="nothing to start from"):
        checkpoint.check_resume(other.replace(init_from=str(tmp_path / "none")), 4)


# ---- split on the zoo (layer names from netspec.analyze) -------------------------------------
@pytest.mark.parametrize("name", ["debug", "alexnet_cifar", "vgg16_cifar", "resnet_cifar"])
def test_zoo_nets_split_exactly_at_their_boundary(name):
    from layerplan.netspec import zoo
    from layerplan.netspec.load import resolve_model

    net, _ = resolve_model(name)
    torch.manual_seed(0)
    module, shape = zoo.build(name)
    module.eval()
    s = split_module(module, net.boundary)
    x = torch.randn(2, *shape)
    with torch.no_grad():
        h = s.head(x)
        assert torch.equal(s.tail(h), module(x))
    assert tuple(h.shape[1:]) == net.layer(net.boundary).out_shape
    head_params = sum(p.numel() for p in s.head.parameters())
    assert head_params == sum(layer.params for layer in net.head(net.boundary))
    assert head_params + sum(p.numel() for p in s.tail.parameters()) == net.total_params


def test_every_netspec_cut_of_a_dag_splits_iff_it_is_single():
    """The fx split and NetSpec.cut_is_single agree on every layer of ResNet-20 (shared ReLU calls
    named relu, relu_1, ... as netspec.analyze names them)."""
    from layerplan.netspec.load import resolve_model

    net, factory = resolve_model("resnet_cifar")
    module = factory().eval()
    x = torch.randn(2, *net.input_shape)
    with torch.no_grad():
        want = module(x)
    singles = 0
    for i, layer in enumerate(net.layers[:-1]):
        if net.cut_is_single(i):
            s = split_module(module, layer.name)
            with torch.no_grad():
                assert torch.equal(s.tail(s.head(x)), want), layer.name
            singles += 1
        else:
            with pytest.raises(ConfigError, match="not a single cut"):
                split_module(module, layer.name)
    assert singles >= 10


def test_conv_model_server_puts_one_groups_pull_on_its_link_at_a_time():
    """ConvModelServer: a pull due while another is on the link waits for that one's READY; pulls
    due meanwhile go out in the order they fell due."""
    import collections

    from layerplan.runtime.roles.groups import ConvModelServer

    srv = ConvModelServer.__new__(ConvModelServer)
    srv.due, srv.pulling, sent = collections.deque(), None, []

    def send(j):
        sent.append(j)
        srv.pulling = j

    srv._send_model = send
    for j in (0, 1, 2):  # the start: group 0 at once, 1 and 2 after it, one at a time
        srv._pull(j)
    assert sent == [0] and list(srv.due) == [1, 2]
    srv._ready()
    assert sent == [0, 1] and srv.pulling == 1
    srv._pull(0)  # group 0 pushed meanwhile: its next pull queues behind group 2's
    srv._ready()
    srv._ready()
    assert sent == [0, 1, 2, 0] and not srv.due
    srv._ready()
    assert srv.pulling is None
    srv._pull(1)  # the link is free: at once
    assert sent[-1] == 1


def test_set_grads_makes_the_gradients_views_of_the_flat_vector():
    """``set_grads`` gives each parameter its slice of the reduced flat gradient without a copy (a
    copy into fresh memory each step costs its page faults), and ``flat_grads`` gathers them back."""
    from layerplan.runtime.roles import flat_grads, set_grads

    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    params = list(model.parameters())
    flat = torch.arange(sum(p.numel() for p in params), dtype=torch.float32)
    set_grads(params, flat)
    assert all(p.grad.shape == p.shape for p in params)
    assert torch.equal(flat_grads(params), flat)
    assert all(p.grad.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for p in params)
    torch.optim.SGD(params, lr=0.1, momentum=0.9).step()  # the optimizer takes views as any gradient
    assert torch.equal(flat_grads(params), flat)  # and leaves them as they were


def test_fc_machines_post_their_receives_before_their_sends():
    """FcMachine._exchange: every receive of an exchange is posted before any send (gloo ran half
    the both-ways exchanges posted sends first one direction after the other:
    benchmarks/exchange_order.py), and each peer's tensor comes back under its index."""
    from types import SimpleNamespace

    from layerplan.runtime.roles.hybrid import FcMachine

    fc = FcMachine.__new__(FcMachine)
    fc.fc_ranks, fc.dtype, fc.ctx = [2, 3, 4], torch.float32, SimpleNamespace(device="cpu")
    posted = []
    fc.irecv = lambda t, src, tg: posted.append(("recv", src)) or ("w", src)
    fc.isend = lambda t, dst, tg: posted.append(("send", dst)) or ("w", dst)
    fc.wait = lambda works: None
    got = fc._exchange(7, 4, {0: torch.ones(2, 3), 2: torch.ones(2, 3)}, {0: (2, 1), 2: (2, 5)})
    assert [kind for kind, _ in posted] == ["recv", "recv", "send", "send"]
    assert sorted(src for kind, src in posted if kind == "recv") == [2, 4]
    assert got[0].shape == (2, 1) and got[2].shape == (2, 5)
