"""Training runs on the emulated cluster: rank r in host r, exact against the single-process
reference, the same bytes at any link rate, faults reported and nothing left behind.

Needs network namespaces: root, or else an unprivileged user namespace, where every test re-runs
itself under ``unshare -Urnm`` (EMULATION.md); with neither, the tests skip and say why.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from layerplan.errors import ConfigError
from layerplan.runtime import emulate
from layerplan.runtime.launch import RunError, launch_emulated
from layerplan.runtime.layout import layout
from layerplan.runtime.reference import load_params, reference_run
from layerplan.runtime.run_spec import RunSpec

pytestmark = pytest.mark.dist

IN_USERNS = "LAYERPLAN_TEST_IN_USERNS"


def _userns_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "-Urnm", "--propagation", "private", "true"], capture_output=True)
    return r.returncode == 0


@pytest.fixture
def here(request, tmp_path) -> bool:
    """True: run the test body in this process (root). False: it already ran, and passed, inside a
    user namespace. Skips, with the reason, where network namespaces cannot be made at all."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("the emulated cluster needs iproute2 (`ip`, `tc`)")
    if os.geteuid() == 0:
        return True
    if os.environ.get(IN_USERNS) or not _userns_available():
        pytest.skip("network namespaces need root or an unprivileged user namespace (unshare -Urnm); neither works here")
    script = ("mount -t tmpfs tmpfs /run && mkdir -p /run/netns && "
              f"exec {sys.executable} -m pytest -q -p no:cacheprovider -m dist --basetemp {tmp_path / 'inner'} "
              f"'{request.node.nodeid}'")
    env = dict(os.environ, **{IN_USERNS: "1", "LAYERPLAN_STATE_DIR": str(tmp_path / "emu-state")})
    r = subprocess.run(["unshare", "-Urnm", "--propagation", "private", "sh", "-c", script], env=env,
                       cwd=request.config.rootpath, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"inside a user namespace:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
    return False


def spec_for(tmp_path: Path, strategy: str, config: dict, **kw) -> RunSpec:
    kw = {"timeout_s": 20.0, "steps": 3, "params_out": str(tmp_path / "params"), **kw}
    return RunSpec(model="debug", strategy=strategy, config=config, batch_size=3, lr=0.02, momentum=0.9,
                   deterministic=True, progress=False, **kw)


def host_pids(emu: emulate.Emulated, i: int) -> set[int]:
    r = subprocess.run(["ip", "netns", "pids", emu.host(i)], capture_output=True, text=True)
    return {int(x) for x in r.stdout.split()}


def left_behind(name: str) -> list[str]:
    return [n for n in emulate.namespaces() if n.startswith(f"{emulate.PREFIX}-{name}-")]


@pytest.mark.parametrize("strategy, config, start", [("allreduce", {"workers": 2}, "fork"),
                                                     ("ps", {"workers": 2, "servers": 1}, "exec")],
                         ids=["allreduce-w2-fork", "ps-w2-s1-exec"])
def test_ranks_run_in_their_hosts_and_equal_single_process_sgd(tmp_path, here, strategy, config, start):
    if not here:
        return
    name = f"t{os.getpid()}r"
    spec = spec_for(tmp_path, strategy, config)
    placed: dict[int, bool] = {}

    def on_spawn(pids, run_dir):  # every rank is a process of its own host's network namespace
        for r, pid in pids.items():
            deadline = time.monotonic() + 10
            while pid not in host_pids(emu, r) and time.monotonic() < deadline:
                time.sleep(0.02)  # `ip netns exec` enters the namespace right after the fork
            placed[r] = pid in host_pids(emu, r)

    with emulate.running(3, "1Gbit", name) as emu:
        m = launch_emulated(spec, name, run_dir=tmp_path / "run", on_spawn=on_spawn, start=start, quiet=True)
        assert placed == {r: True for r in layout(spec)}
    assert left_behind(name) == []
    assert emulate.pids(name) == []
    ref = reference_run(spec)
    got = load_params(tmp_path / "params")
    assert set(got) == set(ref["params"])
    for k, v in ref["params"].items():
        torch.testing.assert_close(got[k], v, msg=lambda s: f"{strategy} {k}: {s}")
    torch.testing.assert_close(torch.tensor(m["loss"]), torch.tensor(ref["loss"]))
    assert m["world_size"] == len(layout(spec)) and m["steps"] == [0, 2]


def test_link_rate_changes_no_byte(tmp_path, here):
    """Bytes are counted, not timed: a 100 Mbit cluster and a 1 Gbit one see exactly the same."""
    if not here:
        return
    spec = spec_for(tmp_path, "ps", {"workers": 2, "servers": 1}, params_out=None)
    counted = {}
    for rate in ("100Mbit", "1Gbit"):
        name = f"t{os.getpid()}b{rate[:2]}"
        with emulate.running(3, rate, name):
            m = launch_emulated(spec, name, start="fork", quiet=True)
        counted[rate] = (m["bytes_per_step"]["per_rank"], m["loss"])
        assert left_behind(name) == []
    strip = [{k: row[k] for k in ("rank", "role", "sent", "recv")} for row in counted["100Mbit"][0]]
    assert strip == [{k: row[k] for k in ("rank", "role", "sent", "recv")} for row in counted["1Gbit"][0]]
    assert all(row["sent"] > 0 for row in strip)
    assert counted["100Mbit"][1] == counted["1Gbit"][1]


def test_too_few_hosts_and_no_cluster_are_one_line_errors(tmp_path, here):
    if not here:
        return
    spec = spec_for(tmp_path, "ps", {"workers": 2, "servers": 1})
    name = f"t{os.getpid()}s"
    with emulate.running(2, "1Gbit", name):
        with pytest.raises(ConfigError) as e:
            launch_emulated(spec, name)
    assert str(e.value) == f"run needs 3 hosts, cluster '{name}' has 2: layerplan cluster up --hosts 3 --name {name}"
    with pytest.raises(emulate.EmulationError, match=f"create it first: layerplan cluster up --hosts 3 "
                                                     f"--bandwidth 1Gbit --name {name}"):
        launch_emulated(spec, name)


def test_kill_9_in_a_host_names_the_rank_and_leaves_nothing(tmp_path, here):
    if not here:
        return
    spec = spec_for(tmp_path, "allreduce", {"workers": 3}, steps=100_000, params_out=None, timeout_s=10.0)
    name = f"t{os.getpid()}k"
    killed: dict[str, float] = {}

    def on_spawn(pids, run_dir):
        def killer():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if int((run_dir / "hb-rank2").read_text()) >= 3:
                        break
                except (OSError, ValueError):
                    pass
                time.sleep(0.01)
            killed["t"] = time.monotonic()
            os.kill(pids[2], signal.SIGKILL)

        threading.Thread(target=killer, daemon=True).start()

    with emulate.running(3, "1Gbit", name):
        with pytest.raises(RunError) as e:
            launch_emulated(spec, name, run_dir=tmp_path / "run", on_spawn=on_spawn, start="fork", quiet=True)
        assert time.monotonic() - killed["t"] < 30
        assert emulate.pids(name) == []  # the launcher killed its ranks, not the teardown
    msg = str(e.value)
    assert msg.startswith("rank 2 (worker) was killed by SIGKILL") and "\n" not in msg
    assert left_behind(name) == []
