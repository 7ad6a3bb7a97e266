"""Distributed runs on gloo/CPU: every strategy equals single-process SGD on the global batch, sends
exactly the bytes its schedule charges, survives kill -9 with an exact resume.

Ranks are forked from the test process (``launch_local(start="fork")``: no second torch import);
the CLI test and the fault test use the real ``python -m layerplan.runtime.worker`` processes.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from layerplan.runtime import checkpoint
from layerplan.runtime.launch import RunError, launch_local
from layerplan.runtime.layout import feature_slices, layout, ps_shards
from layerplan.runtime.model import hybrid_phase, resolve, split_layer
from layerplan.runtime.predict import predict_run, timeline_marks
from layerplan.runtime.reference import load_params, reference_run
from layerplan.runtime.run_spec import RunSpec

pytestmark = pytest.mark.dist

CONFIGS = [
    ("ps", {"workers": 2, "servers": 1}),
    ("ps", {"workers": 3, "servers": 2}),
    ("allreduce", {"workers": 2}),
    ("allreduce", {"workers": 3}),
    ("stanza", {"conv_workers": 2, "fc_workers": 1}),
    ("stanza", {"conv_workers": 4, "fc_workers": 2}),
    ("ralp", {"workers": 2}),
    ("ralp", {"workers": 3}),
    ("stanza", {"conv_workers": 3, "fc_workers": 1, "overlap": False}),  # the paper's schedule
]


def make_spec(tmp_path, model, strategy, config, batch, steps=5, **kw):
    kw.setdefault("timeout_s", 30.0)
    return RunSpec(model=model, strategy=strategy, config=config, batch_size=batch, steps=steps, lr=0.02,
                   momentum=0.9, deterministic=True, progress=False, params_out=str(tmp_path / "params"), **kw)


def expected_sent(spec, net, module) -> dict[int, int]:
    """Bytes each rank must send per step (metrics.py's counting rule), from the NetSpec."""
    roles = layout(spec)
    k = spec.batch_size
    p_all = sum(p.numel() for p in module.parameters()) * net.dtype_bytes
    assert p_all == net.param_bytes
    out = {}
    if spec.strategy == "ps":
        nw = spec.config["workers"]
        shards = ps_shards(net.total_params, spec.config["servers"])
        for r, role in roles.items():
            out[r] = p_all if role.kind == "worker" else nw * (shards[role.index][1] - shards[role.index][0]) * 4
    elif spec.strategy == "hybrid":
        out = hybrid_expected_sent(spec, net)
    elif spec.strategy == "allreduce":
        bufs = sum(b.numel() * b.element_size() for b in module.buffers()) * net.dtype_bytes // \
            next(module.parameters()).element_size()
        out = {r: p_all + bufs for r in roles}
    else:
        cut = split_layer(spec, net)
        act = net.layer(cut).out_bytes * k  # K·A values of the split layer
        head = sum(layer.param_bytes for layer in net.head(cut))
        tail = p_all - head
        for r, role in roles.items():
            if role.kind == "conv_worker":
                out[r] = act + (head if spec.config["conv_workers"] > 1 else 0)
            elif role.kind == "fc_worker":
                out[r] = len(role.peers) * act + (tail if spec.config["fc_workers"] > 1 else 0)
            elif role.kind == "worker":  # ralp
                out[r] = act + head
            else:  # ralp PS worker
                out[r] = spec.config["workers"] * (act + head)
    return out


def hybrid_expected_sent(spec, net) -> dict[int, int]:
    """hybrid, rank by rank (roles/hybrid.py): activations to the FC machines, partial or row
    gradients back, one all-gather/reduce-scatter or transpose pair per block boundary, the logits'
    transpose pair after a partitioned last block, all-reduces of replicated blocks and of the conv
    gradients."""
    n_c, n_f, k = spec.config["conv_workers"], spec.config["fc_workers"], spec.batch_size
    g, e = n_c * k, net.dtype_bytes
    phase = hybrid_phase(spec, net)
    a = net.layer(phase.conv_end).out_bytes
    p_conv = sum(x.param_bytes for x in net.layers[:net.index(phase.conv_end) + 1])
    rows = [((q + 1) * n_c // n_f - q * n_c // n_f) * k for q in range(n_f)]
    first = phase.blocks[0]
    out = {i: a * k * (n_f if first.partitioned else 1) + (p_conv if n_c > 1 else 0) for i in range(n_c)}
    for q in range(n_f):
        others = [p for p in range(n_f) if p != q]
        b = a * (g if first.partitioned else rows[q])  # gradients back to the CONV workers
        for prev, blk in zip(phase.blocks, phase.blocks[1:]):
            x = net.layer(prev.layers[-1]).out_bytes  # values per sample crossing this boundary
            sl = feature_slices(x // e, n_f)
            width = [(hi - lo) * e for lo, hi in sl]
            if prev.partitioned and blk.partitioned:  # all-gather slices; reduce-scatter partials
                b += (n_f - 1) * g * width[q] + sum(g * width[p] for p in others)
            elif blk.partitioned:  # all-gather rows; reduce-scatter rows
                b += (n_f - 1) * rows[q] * x + sum(rows[p] * x for p in others)
            elif prev.partitioned:  # transpose and back
                b += sum(rows[p] * width[q] for p in others) + sum(rows[q] * width[p] for p in others)
        last = phase.blocks[-1]
        if last.partitioned:
            sl = feature_slices(net.layer(last.layers[-1]).out_bytes // e, n_f)
            width = [(hi - lo) * e for lo, hi in sl]
            b += sum(rows[p] * width[q] for p in others) + sum(rows[q] * width[p] for p in others)
        if n_f > 1:
            b += sum(net.layer(name).param_bytes for blk in phase.blocks if not blk.partitioned for name in blk.layers)
        out[n_c + q] = b
    return out


def check_run(tmp_path, model, strategy, config, batch, **kw):
    spec = make_spec(tmp_path, model, strategy, config, batch, **kw)
    m = launch_local(spec, run_dir=tmp_path / "run", start="fork")
    ref = reference_run(spec)
    got = load_params(tmp_path / "params")
    assert set(got) == set(ref["params"])
    for name, value in ref["params"].items():
        torch.testing.assert_close(got[name], value, msg=lambda s: f"{strategy} {config} {name}: {s}")
    torch.testing.assert_close(torch.tensor(m["loss"]), torch.tensor(ref["loss"]))
    net, factory = resolve(spec)
    scale = torch.empty(0, dtype=getattr(torch, spec.dtype)).element_size() // net.dtype_bytes
    want = {r: b * scale for r, b in expected_sent(spec, net, factory().to(getattr(torch, spec.dtype))).items()}
    sent = {row["rank"]: row["sent"] for row in m["bytes_per_step"]["per_rank"]}
    assert sent == want
    recv = {row["rank"]: row["recv"] for row in m["bytes_per_step"]["per_rank"]}
    assert sum(recv.values()) == sum(sent.values())  # every byte sent is received (collectives: payload)
    assert m["global_batch"] == batch * sum(1 for r in layout(spec).values() if r.data_index is not None)
    assert m["world_size"] == len(layout(spec)) and m["steps"] == [0, 4]
    assert set(m["breakdown"]) == {r.kind for r in layout(spec).values()}
    assert m["step_time_s"] > 0 and m["throughput_samples_per_s"] > 0
    # The engine's schedule charges each role the bytes the runtime sends (payload rule), within 2%.
    pred = predict_run(spec)
    assert set(pred["bytes_per_step"]["per_role"]) == set(m["bytes_per_step"]["per_role"])
    for role, sent_b in m["bytes_per_step"]["per_role"].items():
        assert pred["bytes_per_step"]["per_role"][role] == pytest.approx(sent_b, rel=0.02), role
    assert pred["bytes_per_step"]["total"] == pytest.approx(m["bytes_per_step"]["total"], rel=0.02)
    # Each point a role marks in its step ends a task of the schedule on the role's row, in the same order.
    marks = {k: b["marks_s"] for k, b in m["breakdown"].items() if "marks_s" in b}
    if strategy in ("allreduce", "stanza", "ps", "ralp"):
        # Timed from the opening role's mean start (metrics._step_starts): on a tiny net, a rank that
        # began before that mean can reach its first point a fraction of a millisecond before it.
        assert marks and all(-m["step_time_s"] < t < m["step_time_s"] * 10 for v in marks.values() for t in v.values())
    points = timeline_marks(pred, marks)
    assert {k: list(v) for k, v in points.items()} == {k: list(v) for k, v in marks.items()}
    for role, v in points.items():
        assert sorted(v, key=v.get) == list(marks[role]), role
    return m


@pytest.mark.parametrize("strategy, config", CONFIGS, ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}{x}" for k, x in v.items()))
def test_debug_equals_single_process_sgd_and_sends_expected_bytes(tmp_path, strategy, config):
    check_run(tmp_path, "debug", strategy, config, batch=3)


HYBRID = [
    {"conv_workers": 2, "fc_workers": 1},
    {"conv_workers": 2, "fc_workers": 2},
    {"conv_workers": 3, "fc_workers": 3},
    {"conv_workers": 2, "fc_workers": 2, "replicate": ["fc2"]},  # Yan §6.4: the output layer replicated
    {"conv_workers": 3, "fc_workers": 2, "replicate": ["fc1"]},  # replicated → partitioned, uneven blocks
    {"conv_workers": 2, "fc_workers": 3, "replicate": ["fc1"]},  # an FC machine with no rows of its own
]


def _hid(c: dict) -> str:
    return f"nc{c['conv_workers']}-nf{c['fc_workers']}" + "".join(f"-rep-{r}" for r in c.get("replicate", []))


@pytest.mark.parametrize("config", HYBRID, ids=_hid)
def test_hybrid_equals_single_process_sgd_and_sends_the_schedules_bytes(tmp_path, config):
    """Partitioned fc layers (n_f = 1, 2, 3), a replicated output layer, mixed layouts: the run equals
    single-process SGD on the global batch after 5 steps, every rank sends exactly the bytes the
    layout rules give, and the engine's schedule charges each role the same bytes (within 2%)."""
    check_run(tmp_path, "debug", "hybrid", config, batch=3)


@pytest.mark.slow
@pytest.mark.parametrize("config", [{"conv_workers": 2, "fc_workers": 2},
                                    {"conv_workers": 2, "fc_workers": 2, "replicate": ["classifier.6"]}], ids=_hid)
def test_hybrid_alexnet_cifar_equals_single_process_sgd(tmp_path, config):
    check_run(tmp_path, "alexnet_cifar", "hybrid", config, batch=2, dtype="float64")


def test_hybrid_resnet_cifar_in_float64(tmp_path):
    """BatchNorm in the conv phase: per-CONV-worker batch statistics, as the reference chunks them."""
    check_run(tmp_path, "resnet_cifar", "hybrid", {"conv_workers": 2, "fc_workers": 2}, batch=2, dtype="float64")


FAST_ALEXNET = {("stanza", "conv_workers2-fc_workers1"), ("ralp", "workers2")}


@pytest.mark.parametrize("strategy, config", [
    pytest.param(s, c, marks=() if (s, "-".join(f"{k}{x}" for k, x in c.items())) in FAST_ALEXNET
                 else pytest.mark.slow) for s, c in CONFIGS],
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}{x}" for k, x in v.items()))
def test_alexnet_cifar_equals_single_process_sgd(tmp_path, strategy, config):
    """float64, so that 'equal' means equal: in float32 the servers' shard sums round differently."""
    check_run(tmp_path, "alexnet_cifar", strategy, config, batch=2, dtype="float64")


@pytest.mark.parametrize("strategy, config", [("ralp", {"workers": 2, "split": "relu3"}),
                                              ("stanza", {"conv_workers": 3, "fc_workers": 2, "split": "pool"})],
                         ids=["ralp-split-relu3", "stanza-split-pool"])
def test_a_chosen_split_layer_is_exact_too(tmp_path, strategy, config):
    check_run(tmp_path, "debug", strategy, config, batch=3)


BIG = [CONFIGS[1], CONFIGS[3], CONFIGS[5], CONFIGS[7]]


@pytest.mark.slow
@pytest.mark.parametrize("strategy, config", BIG, ids=["ps", "allreduce", "stanza", "ralp"])
def test_vgg16_cifar_equals_single_process_sgd(tmp_path, strategy, config):
    check_run(tmp_path, "vgg16_cifar", strategy, config, batch=2)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, config", BIG, ids=["ps", "allreduce", "stanza", "ralp"])
def test_resnet_cifar_dag_equals_single_process_sgd_in_float64(tmp_path, strategy, config):
    """ResNet-20 is a DAG with BatchNorm. BatchNorm over a worker's 2–8 samples amplifies rounding
    (1/sqrt(var + eps) on near-constant channels, ReLUs flipping at 0): in float32 a 1-ulp
    difference in the order the workers' gradients are summed grows to ~1e-3 in conv1 within 5
    steps (the float32 single-process reference itself ends 3.6e-3 away from the same reference
    in float64). In float64 rounding stays far below the default tolerances, so agreement shows
    the distributed run computes exactly the reference's function."""
    check_run(tmp_path, "resnet_cifar", strategy, config, batch=2, dtype="float64")


def test_reference_chunking_changes_nothing_without_batchnorm():
    spec = RunSpec(model="debug", strategy="stanza", config={"conv_workers": 2}, batch_size=3, steps=3,
                   deterministic=True)
    a, b = reference_run(spec), reference_run(spec, chunked=False)
    for k in a["params"]:
        torch.testing.assert_close(a["params"][k], b["params"][k])


def test_digits_runs_repeat_exactly(tmp_path):
    spec = make_spec(tmp_path, "debug", "ps", {"workers": 2}, 8, steps=4, data="digits")
    m1 = launch_local(spec, start="fork")
    m2 = launch_local(spec, start="fork")
    assert m1["loss"] == m2["loss"]
    torch.testing.assert_close(torch.tensor(m1["loss"]), torch.tensor(reference_run(spec)["loss"]))


def test_stanza_checkpoints_send_fc_parameters_to_a_conv_worker(tmp_path):
    spec = make_spec(tmp_path, "debug", "stanza", {"conv_workers": 4, "fc_workers": 2}, 2, steps=4,
                     checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=2)
    m = launch_local(spec, start="fork")
    net, factory = resolve(spec)
    tail_bytes = net.param_bytes - sum(x.param_bytes for x in net.head(split_layer(spec, net)))
    assert m["checkpoint_bytes_sent"] == {"0": 0, "1": 0, "2": 0, "3": 0, "4": 2 * tail_bytes, "5": 2 * tail_bytes}
    files = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert files == ["latest.json", "step-00000004"]
    state = torch.load(tmp_path / "ck" / "step-00000004" / "ckpt-rank2.pt", weights_only=False)
    assert state["role"]["fc_backup"]["fc_rank"] == 5 and state["data"]["step"] == 4
    from layerplan.runtime.split import split_module

    names = [n for n, _ in split_module(factory(), split_layer(spec, net)).tail.named_parameters()]
    final = load_params(tmp_path / "params")
    torch.testing.assert_close(state["role"]["fc_backup"]["params"], torch.cat([final[n].reshape(-1) for n in names]))


def test_kill_9_names_the_rank_and_resume_is_exact(tmp_path):
    spec = make_spec(tmp_path, "debug", "stanza", {"conv_workers": 2, "fc_workers": 1}, 3, steps=100_000,
                     checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=3, timeout_s=10.0)
    killed: dict[str, float] = {}

    def on_spawn(pids, run_dir):
        def killer():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if int((run_dir / "hb-rank1").read_text()) >= 7:
                        break
                except (OSError, ValueError):
                    pass
                time.sleep(0.01)
            killed["t"] = time.monotonic()
            os.kill(pids[1], signal.SIGKILL)

        threading.Thread(target=killer, daemon=True).start()

    with pytest.raises(RunError) as e:
        launch_local(spec, run_dir=tmp_path / "run", on_spawn=on_spawn)  # real worker processes
    assert time.monotonic() - killed["t"] < 30
    msg = str(e.value)
    assert msg.startswith("rank 1 (conv_worker) was killed by SIGKILL") and "last good checkpoint: step" in msg
    assert "\n" not in msg
    done = int(msg.split("last good checkpoint: step ")[1].split()[0])
    assert done >= 6 and done % 3 == 0

    resumed = spec.replace(resume=True, steps=done + 3, params_out=str(tmp_path / "resumed"))
    m = launch_local(resumed, start="fork")
    assert m["steps"] == [done, done + 2]
    straight = spec.replace(steps=done + 3, checkpoint_dir=None, checkpoint_every=0,
                            params_out=str(tmp_path / "straight"))
    launch_local(straight, start="fork")
    a, b = load_params(tmp_path / "resumed"), load_params(tmp_path / "straight")
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("strategy, config", [("ps", {"workers": 2, "servers": 2}), ("allreduce", {"workers": 2}),
                                              ("ralp", {"workers": 2}),
                                              ("hybrid", {"conv_workers": 2, "fc_workers": 2, "replicate": ["fc2"]})])
def test_resume_is_exact_for_every_strategy(tmp_path, strategy, config):
    ck = str(tmp_path / "ck")
    first = make_spec(tmp_path, "debug", strategy, config, 3, steps=3, checkpoint_dir=ck)
    launch_local(first, start="fork")
    launch_local(first.replace(steps=6, resume=True, params_out=str(tmp_path / "a")), start="fork")
    launch_local(first.replace(steps=6, checkpoint_dir=None, params_out=str(tmp_path / "b")), start="fork")
    a, b = load_params(tmp_path / "a"), load_params(tmp_path / "b")
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_a_failing_rank_is_reported_in_one_line(tmp_path):
    out = tmp_path / "params"
    spec = make_spec(tmp_path, "debug", "ps", {"workers": 2}, 3, steps=2).replace(params_out=str(out))

    def break_it(pids, run_dir):  # the directory, checked before the start, turns into a file after it
        out.rmdir()
        out.write_text("not a directory")

    with pytest.raises(RunError) as e:
        launch_local(spec, start="fork", run_dir=tmp_path / "run", on_spawn=break_it)
    msg = str(e.value)
    assert msg.startswith("rank ") and "exited with code 1" in msg and "FileExistsError" in msg and "\n" not in msg
    # the failed run keeps its logs where the message says
    assert msg.endswith(f"logs in {tmp_path / 'run'}") and "FileExistsError" in (tmp_path / "run" / "rank0.log").read_text()


def test_bad_input_fails_before_any_process_starts(tmp_path):
    from layerplan.errors import ConfigError

    with pytest.raises(ConfigError, match="imagefolder"):
        launch_local(make_spec(tmp_path, "debug", "ps", {"workers": 2}, 3, data="imagefolder:" + str(tmp_path / "x")))
    with pytest.raises(ConfigError, match="not a layer"):
        launch_local(make_spec(tmp_path, "debug", "stanza", {"conv_workers": 2, "split": "nope"}, 3))
    with pytest.raises(ConfigError, match="threads_per_rank"):
        launch_local(make_spec(tmp_path, "debug", "ps", {"workers": 2}, 3, threads_per_rank=2), start="fork")
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(ConfigError, match="is a file; name a directory"):
        launch_local(make_spec(tmp_path, "debug", "ps", {"workers": 2}, 3).replace(params_out=str(tmp_path / "file")))


# ---- Omnivore's compute groups ------------------------------------------------------------
def check_groups_bytes(spec, m):
    """Per step (one round): a conv machine sends B·A + P_c, the FC server N·B·A, the conv model
    server N·P_c — what the engine's groups schedule charges."""
    net, factory = resolve(spec)
    scale = torch.empty(0, dtype=getattr(torch, spec.dtype)).element_size() // net.dtype_bytes
    cut = split_layer(spec, net)
    act = net.layer(cut).out_bytes * spec.batch_size * scale
    head = sum(layer.param_bytes for layer in net.head(cut)) * scale
    n = spec.config["machines"]
    want = {"conv_machine": act + head, "fc_server": n * act, "conv_model_server": n * head}
    assert m["bytes_per_step"]["per_role"] == want
    pred = predict_run(spec)
    assert pred["groups"] == {"conv_machine": n, "fc_server": 1, "conv_model_server": 1}
    for role, sent_b in want.items():
        assert pred["bytes_per_step"]["per_role"][role] == pytest.approx(sent_b, rel=0.02), role
    assert pred["bytes_per_step"]["total"] == pytest.approx(m["bytes_per_step"]["total"], rel=0.02)


@pytest.mark.parametrize("model, machines, dtype", [("debug", 2, "float32"), ("debug", 3, "float32"),
                                                    ("alexnet_cifar", 2, "float64")])
def test_groups_with_one_group_equal_single_process_sgd(tmp_path, model, machines, dtype):
    """g = 1 with the merged FC server is synchronous SGD (Omnivore §IV-A): the parameters after 5
    steps and every step's loss equal the single-process reference."""
    spec = make_spec(tmp_path, model, "groups", {"machines": machines, "groups": 1}, 2 if model != "debug" else 3,
                     dtype=dtype)
    m = launch_local(spec, start="fork")
    ref = reference_run(spec)
    got = load_params(tmp_path / "params")
    assert set(got) == set(ref["params"])
    for name, value in ref["params"].items():
        torch.testing.assert_close(got[name], value, msg=lambda s: f"groups {name}: {s}")
    torch.testing.assert_close(torch.tensor(m["loss"]), torch.tensor(ref["loss"]))
    assert m["staleness"]["histogram"] == {"0": 5} and m["staleness"]["median"] == 0
    assert [(u["group"], u["iteration"]) for u in m["group_updates"]] == [(0, s) for s in range(5)]
    assert m["global_batch"] == machines * spec.batch_size and m["world_size"] == machines + 2
    check_groups_bytes(spec, m)


def test_groups_run_asynchronously_and_report_staleness(tmp_path):
    spec = make_spec(tmp_path, "debug", "groups", {"machines": 4, "groups": 2}, 2, steps=6)
    m = launch_local(spec, start="fork")
    assert m["steps"] == [0, 5] and len(m["loss"]) == 6 and all(x is not None and x > 0 for x in m["loss"])
    ups = m["group_updates"]
    assert len(ups) == 12 and [u["order"] for u in ups] == list(range(12))
    for j in range(2):  # every group does every iteration, in order
        assert [u["iteration"] for u in ups if u["group"] == j] == list(range(6))
    st = m["staleness"]
    assert st["groups"] == 2 and st["expected"] == 1 and st["updates"] == 12
    assert sum(st["histogram"].values()) == 12 and len(st["per_update"]) == 12
    values = [u["staleness"] for u in st["per_update"]]
    # another group's updates between a group's pull and push: at most all of the other group's 6
    assert all(0 <= v <= 6 for v in values) and st["max"] == max(values) and st["mean"] == pytest.approx(
        sum(values) / 12)
    assert values[0] == 0  # the first update applied anything is fresh
    check_groups_bytes(spec, m)
    with pytest.raises(Exception, match="no single-process reference"):
        reference_run(spec)


def test_groups_resume_is_exact_and_init_from_applies_the_new_hyperparameters(tmp_path):
    """A groups checkpoint after the last step is a consistent cut: resuming g = 1 equals an
    uninterrupted run; ``init_from`` (tune's trials) continues it with other groups, lr and momentum."""
    ck = str(tmp_path / "ck")
    first = make_spec(tmp_path, "debug", "groups", {"machines": 2, "groups": 1}, 3, steps=3, checkpoint_dir=ck)
    launch_local(first, start="fork")
    launch_local(first.replace(steps=6, resume=True, params_out=str(tmp_path / "a")), start="fork")
    launch_local(first.replace(steps=6, checkpoint_dir=None, params_out=str(tmp_path / "b")), start="fork")
    a, b = load_params(tmp_path / "a"), load_params(tmp_path / "b")
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    trial = first.replace(config={"machines": 2, "groups": 2}, lr=0.005, momentum=0.3, steps=8,
                          checkpoint_dir=str(tmp_path / "trial"), init_from=ck, params_out=None)
    m = launch_local(trial, start="fork")  # ck holds the resumed run's step 6
    assert m["steps"] == [6, 7] and m["staleness"]["groups"] == 2 and m["staleness"]["updates"] == 4
    info = checkpoint.latest(tmp_path / "trial")
    assert info["step"] == 8
    for rank in (2, 3):  # the FC server and the conv model server: this run's lr and momentum, not the saved
        state = torch.load(tmp_path / "trial" / info["dir"] / f"ckpt-rank{rank}.pt", weights_only=False)
        assert [(g["lr"], g["momentum"]) for g in state["role"]["opt"]["param_groups"]] == [(0.005, 0.3)]


def test_a_session_runs_many_specs_on_the_same_ranks_exactly_as_launches_do(tmp_path):
    """tune's trials: one start and rendezvous, then runs of different (g, µ, η) on the same N + 2
    ranks; each run starts from its spec's initialisation, so it equals its own launch."""
    from layerplan.runtime.launch import Session

    a = make_spec(tmp_path, "debug", "groups", {"machines": 2, "groups": 1}, 3).replace(params_out=None)
    b = a.replace(config={"machines": 2, "groups": 2}, momentum=0.3, lr=0.05, steps=4)
    with Session(a) as s:
        run_dir = s.run_dir
        first, second, again = s.run(a), s.run(b), s.run(a)
        with pytest.raises(Exception, match="cannot run a layout of 5"):
            s.run(a.replace(config={"machines": 3, "groups": 1}))
    assert not run_dir.exists()  # a clean session leaves nothing behind
    assert first["loss"] == again["loss"] == launch_local(a, start="fork")["loss"]
    assert len(second["loss"]) == 4 and second["staleness"]["groups"] == 2
