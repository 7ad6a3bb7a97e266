"""Bad input: one clear line on stderr, exit code 2, no traceback (issue: >= 20 kinds)."""

import json
import subprocess
import sys

import pytest

from layerplan.cli import main

BAD_FACTORIES = '''
import torch.nn as nn

def raises():
    raise ValueError("weights file is corrupt")

def not_a_module():
    return 42

class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3)
    def forward(self, x):
        if x.sum() > 0:           # data-dependent control flow: fx cannot trace it
            return {"y": self.c(x)}
        return None

def dict_out():
    return DictOut()

def fine():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
'''


@pytest.fixture
def files(tmp_path):
    f = tmp_path / "factories.py"
    f.write_text(BAD_FACTORIES)
    (tmp_path / "syntax.py").write_text("def broken(:\n")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "badkey.json").write_text(json.dumps({"format": 1, "colour": "red"}))
    (tmp_path / "cluster_unknown_key.yaml").write_text("name: x\nnodes: 2\ndevice: v100\nnic: 10gbe\nspeed: 3\n")
    (tmp_path / "cluster_malformed.yaml").write_text("name: x\nnodes: [2\n")
    (tmp_path / "cluster_bad_unit.yaml").write_text(
        "name: x\nnodes: 2\ndevice: v100\nnic: {name: e, bandwidth_bytes_per_s: 10Gbat}\n")
    (tmp_path / "cluster_list.json").write_text("[1, 2]")
    return tmp_path


def cases(t):
    f = t / "factories.py"
    return [
        (["profile", "alexnett"], "unknown model"),
        (["profile", str(t / "nofile.py") + ":build"], "nofile.py"),
        (["profile", "no_such_package.models:build"], "no_such_package"),
        (["profile", f"{f}:missing"], "missing"),
        (["profile", f"{f}:raises"], "weights file is corrupt"),
        (["profile", f"{f}:not_a_module"], "nn.Module"),
        (["profile", f"{f}:dict_out", "--input-size", "8"], "dict_out"),
        (["profile", f"{t / 'syntax.py'}:broken"], "syntax.py"),
        (["profile", f"{f}:fine"], "input"),  # no input shape known: asks for --input-size
        (["profile", f"{f}:fine", "--input-size", "3"], "input"),  # the model rejects 3x3 input
        (["profile", "alexnet", "--input-size", "16"], "16"),
        (["profile", "debug", "--batch-size", "0"], "batch-size"),
        (["profile", "debug", "--num-classes", "-3"], "num-classes"),
        (["profile", "debug", "--ralp-threshold", "low"], "ralp-threshold"),
        (["profile", str(t / "bad.json")], "JSON"),
        (["profile", str(t / "badkey.json")], "unknown key"),
        (["profile", str(t / "missing.json")], "missing.json"),
        (["profile", "debug", "--save", str(t / "no" / "such" / "dir" / "x.json")], "No such file"),
        (["hardware", "--cluster", str(t / "cluster_unknown_key.yaml")], "unknown key"),
        (["hardware", "--cluster", str(t / "cluster_malformed.yaml")], "YAML"),
        (["hardware", "--cluster", str(t / "cluster_bad_unit.yaml")], "unknown unit"),
        (["hardware", "--cluster", str(t / "cluster_list.json")], "mapping"),
        (["hardware", "--cluster", "p9.tiny"], "unknown cluster preset"),
        (["hardware", "--bandwidth", "10Gbat"], "10Gbat"),
        (["hardware", "--device", "titan-z"], "unknown device"),
        (["hardware", "--nodes", "0"], "nodes"),
        (["validate", "--strategies", "ps,dp"], "unknown strategy dp"),
        (["validate", "--budget", "-1"], "--budget takes minutes"),
        (["calibrate", "--quick", "-o", str(t)], "is a directory; name a file"),  # before minutes of measuring
        (["validate", "--out", str(t / "bad.json")], "is a file; name a directory"),  # before the calibration
        (["frobnicate"], "invalid choice"),
    ]


def test_at_least_twenty_kinds_of_bad_input(files):
    assert len(cases(files)) >= 20


@pytest.mark.parametrize("i", range(31))
def test_bad_input_one_line_exit_2(files, capsys, i):
    argv, needle = cases(files)[i]
    with pytest.raises(SystemExit) if argv[0] == "frobnicate" or any(a in ("0", "-3", "low") for a in argv) else _nothing():
        rc = main(argv)
        assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert needle.lower() in err.lower(), err
    if not err.startswith("usage:"):
        assert len(err.splitlines()) == 1, err


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_console_script_exit_code_and_no_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "layerplan.cli", "profile", "no_such_net"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1


def test_debug_shows_the_traceback():
    r = subprocess.run([sys.executable, "-m", "layerplan.cli", "--debug", "hardware", "--device", "nope"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" in r.stderr
