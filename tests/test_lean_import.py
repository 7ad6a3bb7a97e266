"""Zoo analysis keeps torch._dynamo and weight initialisation out, and leaves no trace behind."""

import subprocess
import sys

CHECK = r"""
import sys
import torch
import torch.nn.init as init
from torch.utils import flop_counter
originals = {n: getattr(init, n) for n in ("kaiming_normal_", "normal_", "uniform_", "constant_")}
from layerplan.netspec.load import resolve_model
net, _ = resolve_model("resnet_cifar")
assert net.total_params > 0
assert "torch._dynamo" not in sys.modules, "analysis imported torch._dynamo"
assert all(getattr(init, n) is f for n, f in originals.items()), "nn.init not restored"
raw = flop_counter._FlopCounterMode.__dict__["__torch_dispatch__"].__wrapped__
assert not hasattr(raw, "__dynamo_disable"), "a stand-in mark survived"
import torch._dynamo  # the real package, after the block
assert hasattr(torch._dynamo, "optimize") and torch._dynamo.__file__
w = torch.empty(4, 4)
init.constant_(w, 3.0)
assert float(w.sum()) == 48.0
print("ok")
"""


def test_zoo_analysis_leaves_torch_as_it_found_it(tmp_path):
    env = {"LAYERPLAN_NO_CACHE": "1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "ok"
