"""`layerplan train` as a user types it (the command group registers through cli._EXTENSIONS)."""

from __future__ import annotations

import json

import pytest

from layerplan import cli
from layerplan.runtime.run_spec import RunSpec


@pytest.mark.dist
def test_train_prints_json_measurement(capsys, tmp_path):
    rc = cli.main(["train", "debug", "--strategy", "ps", "--workers", "2", "--servers", "1", "--steps", "3",
                   "--batch-size", "4", "--json", "--metrics-out", str(tmp_path / "m.json"),
                   "--spec-out", str(tmp_path / "spec.json")])
    assert rc == 0
    m = json.loads(capsys.readouterr().out)
    assert m["strategy"] == "ps" and m["global_batch"] == 8 and m["steps"] == [0, 2] and len(m["loss"]) == 3
    assert set(m["bytes_per_step"]["per_role"]) == {"worker", "server"}
    saved = json.loads((tmp_path / "m.json").read_text())
    assert saved["loss"] == m["loss"]
    # the prediction stands beside the measurement, in the same terms, in stdout and in the file
    assert saved["prediction"]["bytes_per_step"]["per_role"] == pytest.approx(m["bytes_per_step"]["per_role"], rel=0.02)
    assert saved["comparison"]["step_time_s"]["measured"] == m["step_time_s"]
    assert m["prediction"]["strategy"] == "ps" and m["prediction"]["config"] == {"workers": 2, "servers": 1}
    assert RunSpec.load(tmp_path / "spec.json").config == {"workers": 2, "servers": 1}


def test_train_on_torchrun_writes_spec_and_prints_the_command(capsys, tmp_path):
    out = tmp_path / "s.json"
    rc = cli.main(["train", "debug", "--strategy", "ralp", "--workers", "3", "--on", "torchrun", "--spec-out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "torchrun --nproc-per-node 4 -m layerplan.runtime.worker --spec" in text
    assert RunSpec.load(out).config == {"workers": 3, "split": None, "ralp_setting": "N"}


@pytest.mark.parametrize("argv, words", [
    (["debug", "--strategy", "allreduce", "--servers", "2"], "--servers does not apply to allreduce"),
    (["debug", "--strategy", "stanza", "--conv-workers", "1", "--fc-workers", "2"], "fc_workers <= conv_workers"),
    (["debug", "--strategy", "stanza", "--split", "nope"], "not a layer"),
    (["resnet_cifar", "--strategy", "ralp", "--split", "layer1.0.conv1"], "not single"),
    (["nin", "--strategy", "stanza"], "stanza needs an FC phase"),
    (["nin", "--strategy", "ralp"], "ralp needs an FC phase"),
    (["debug", "--strategy", "stanza", "--split", "fc2"], "last layer"),
    (["debug", "--strategy", "hybrid", "--fc-workers", "2", "--replicate", "fc9"], "'fc9', not an fc layer"),
    (["nin", "--strategy", "hybrid"], "hybrid needs an FC phase"),
    (["debug", "--strategy", "hybrid", "--fc-workers", "11"], "fewer than the 11 FC machines"),
    (["debug", "--strategy", "stanza", "--replicate", "fc2"], "--replicate does not apply to stanza"),
    (["debug", "--strategy", "hybrid", "--workers", "2", "--conv-workers", "3"], "both given and differ"),
    (["debug", "--strategy", "groups", "--workers", "4", "--groups", "3"], "3 groups do not divide 4 conv machines"),
    (["debug", "--strategy", "groups", "--workers", "4"], "give --groups"),
    (["nin", "--strategy", "groups", "--groups", "1"], "groups needs an FC phase"),
    (["debug", "--strategy", "groups", "--groups", "1", "--checkpoint-dir", "/tmp/x", "--checkpoint-every", "2"],
     "only after the last step"),
    (["debug", "--strategy", "groups", "--groups", "1", "--init-from", "/nonexistent/ck"], "nothing to start from"),
    (["debug", "--strategy", "ps", "--groups", "2"], "--groups does not apply to ps"),
    (["debug", "--strategy", "allreduce", "--no-overlap"], "--no-overlap does not apply to allreduce"),

    (["debug", "--strategy", "ps", "--workers", "100"], "more than makes sense"),
    (["debug", "--strategy", "ps", "--data", "mnist"], "data must be"),
    (["debug", "--strategy", "ps", "--data", "imagefolder:/nonexistent"], "not a directory"),
    (["debug", "--strategy", "ps", "--resume"], "checkpoint_dir"),
    (["debug", "--strategy", "ps", "--resume", "--checkpoint-dir", "/nonexistent"], "nothing to resume"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, words):
    rc = cli.main(["train", *argv, "--on", "torchrun", "--spec-out", "/dev/null"])
    err = capsys.readouterr().err
    assert rc == 2 and words in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["--strategy", "gossip"], ["--strategy", "ps", "--workers", "0"],
                                  ["--strategy", "hybrid", "--fc-workers", "0"],
                                  ["--strategy", "hybrid", "--replicate", "fc1,fc1"]])
def test_argparse_rejects(capsys, argv):
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "debug", *argv])
    assert e.value.code == 2


def test_train_plan_runs_what_plan_wrote(capsys, tmp_path):
    plan = tmp_path / "plan.json"
    assert cli.main(["plan", "alexnet_cifar", "--cluster", "local-cpu", "--nodes", "3", "--batch-size", "4",
                     "--strategies", "stanza,ralp,ps", "-o", str(plan), "--json"]) == 0
    planned = json.loads(plan.read_text())
    capsys.readouterr()
    out = tmp_path / "spec.json"
    assert cli.main(["train", "--plan", str(plan), "--on", "torchrun", "--spec-out", str(out)]) == 0
    spec = RunSpec.load(out)
    assert (spec.model, spec.strategy, spec.batch_size) == ("alexnet_cifar", planned["strategy"], 4)
    for key, value in planned["config"].items():
        assert spec.config[{"setting": "ralp_setting"}.get(key, key)] == value


def test_train_plan_runs_a_hybrid_plan(capsys, tmp_path):
    plan = tmp_path / "plan.json"
    assert cli.main(["plan", "debug", "--cluster", "local-cpu", "--nodes", "4", "--batch-size", "4",
                     "--strategy", "hybrid", "-o", str(plan)]) == 0
    text = capsys.readouterr().out
    assert "per fc layer" in text and "fc1: " in text  # partitioned or replicated, and why
    planned = json.loads(plan.read_text())
    assert planned["strategy"] == "hybrid"
    out = tmp_path / "spec.json"
    assert cli.main(["train", "--plan", str(plan), "--on", "torchrun", "--spec-out", str(out)]) == 0
    spec = RunSpec.load(out)
    assert spec.strategy == "hybrid" and spec.batch_size == 4
    assert {k: spec.config[k] for k in planned["config"]} == planned["config"]


def test_hybrid_plan_json_explains_each_fc_layer(capsys):
    assert cli.main(["plan", "yan_imagenet22k", "--input-size", "67", "--num-classes", "1000", "--nodes", "8",
                     "--strategy", "hybrid", "--top", "20", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["ranked"]
    for row in rows:
        assert [x["layer"] for x in row["layers"]] == ["classifier.0", "classifier.2"]
        for x in row["layers"]:
            assert x["choice"] in ("partitioned", "replicated", "whole") and x["reason"].startswith(x["choice"])
            if x["choice"] != "whole":  # Yan §6.4: partitioning moves activations, replicating weights
                assert x["cheaper"] == ("partitioned" if x["activation_bytes"] < x["weight_bytes"] else "replicated")


def test_hybrid_cli_options_reach_the_spec(tmp_path):
    out = tmp_path / "spec.json"
    assert cli.main(["train", "alexnet_cifar", "--strategy", "hybrid", "--workers", "3", "--fc-workers", "2",
                     "--replicate", "classifier.6,classifier.4", "--on", "torchrun", "--spec-out", str(out)]) == 0
    assert RunSpec.load(out).config == {"conv_workers": 3, "fc_workers": 2,
                                        "replicate": ["classifier.6", "classifier.4"], "split": None}
def test_groups_workers_means_conv_machines(tmp_path):
    out = tmp_path / "spec.json"
    assert cli.main(["train", "debug", "--strategy", "groups", "--workers", "4", "--groups", "2", "--on", "torchrun",
                     "--spec-out", str(out)]) == 0
    assert RunSpec.load(out).config == {"machines": 4, "groups": 2, "split": None, "pipelined": False}


def test_train_plan_runs_a_groups_plan(capsys, tmp_path):
    plan = tmp_path / "plan.json"
    assert cli.main(["plan", "alexnet_cifar", "--cluster", "local-cpu", "--nodes", "6", "--batch-size", "4",
                     "--strategies", "groups", "-o", str(plan), "--json"]) == 0
    planned = json.loads(plan.read_text())
    capsys.readouterr()
    out = tmp_path / "spec.json"
    assert cli.main(["train", "--plan", str(plan), "--on", "torchrun", "--spec-out", str(out)]) == 0
    spec = RunSpec.load(out)
    assert spec.strategy == "groups" and spec.config["machines"] == planned["config"]["machines"] == 4
    assert spec.config["groups"] == planned["config"]["groups"]


def test_stanza_workers_means_conv_workers(tmp_path):
    out = tmp_path / "spec.json"
    assert cli.main(["train", "debug", "--strategy", "stanza", "--workers", "3", "--on", "torchrun",
                     "--spec-out", str(out)]) == 0
    assert RunSpec.load(out).config["conv_workers"] == 3


@pytest.mark.parametrize("argv, words", [
    (["--plan", "/nonexistent.json"], "cannot read plan file"),
    ([], "give MODEL"),
    (["debug"], "give --strategy"),
    (["debug", "--strategy", "ps", "--cluster", "nosuch"], "unknown"),
    (["debug", "--strategy", "ps", "--on", "mars"], "expected local, emulated"),
])
def test_bad_train_input_is_one_line_exit_2(capsys, argv, words):
    with pytest.raises(SystemExit) if "--on" in argv else _nullcontext():
        rc = cli.main(["train", *argv, "--spec-out", "/dev/null"])
        err = capsys.readouterr().err
        assert rc == 2 and words in err and err.count("\n") == 1, err


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_plan_names_the_plans_within_two_percent_of_the_best(capsys):
    """resnet_cifar on 2 K40s: butterfly and recursive doubling are one exchange with 2 nodes (the
    same prediction), ring 1% behind: a near tie the user is told to measure; tree 14% behind is not."""
    assert cli.main(["plan", "resnet_cifar", "--cluster", "k40", "--nodes", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    best = doc["ranked"][0]["throughput_samples_per_s"]
    close = [r["rank"] for r in doc["ranked"][1:] if r["throughput_samples_per_s"] >= 0.98 * best]
    assert doc["near_best"][:len(close)] == close and len(close) >= 2
    assert all(r["rank"] not in doc["near_best"] for r in doc["ranked"] if r["throughput_samples_per_s"] < 0.98 * best)
    assert cli.main(["plan", "resnet_cifar", "--cluster", "k40", "--nodes", "2"]) == 0
    assert "within 2% of #1's throughput: a near tie" in capsys.readouterr().out


def test_near_best_is_relative_to_the_best_plan():
    from types import SimpleNamespace

    from layerplan.plan.planner import Ranked, near_best

    def r(throughput):
        return Ranked(strategy="x", config=None, prediction=SimpleNamespace(throughput_samples_per_s=throughput))

    assert near_best([r(100.0), r(99.0), r(98.0), r(97.9)]) == [1, 2]
    assert near_best([r(100.0), r(90.0)]) == [] and near_best([]) == []


@pytest.mark.parametrize("flag, where, words", [
    ("--checkpoint-dir", "a_file", "is a file; name a directory"),
    ("--checkpoint-dir", "a_file/below", "cannot write there"),
    ("--metrics-out", "missing/m.json", "cannot write in"),
    ("--metrics-out", ".", "is a directory; name a file"),
])
def test_unwritable_outputs_fail_before_any_rank_starts(capsys, tmp_path, monkeypatch, flag, where, words):
    """A run that trained and then could not write its checkpoint or measurement lost both: the
    launcher checks them first (no rank is started: Popen is never called)."""
    import subprocess

    import layerplan.netspec.analyze  # noqa: F401 — torch imported before Popen is taken away

    (tmp_path / "a_file").write_text("x")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a rank was started"))
    rc = cli.main(["train", "debug", "--strategy", "allreduce", "--workers", "2", "--steps", "1", "--no-predict",
                   flag, str(tmp_path / where)])
    err = capsys.readouterr().err
    assert rc == 2 and words in err and err.count("\n") == 1, err
