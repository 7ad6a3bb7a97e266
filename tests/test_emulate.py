"""The emulated cluster: shaped links, and nothing left behind (needs root for network namespaces)."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from layerplan.runtime import emulate

needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
                                reason="network namespaces need root and iproute2 (run as root, or inside "
                                       "`unshare -Urnm --propagation private`)")


def test_burst_rule():
    assert emulate.burst_bytes(100e6 / 8) == 64_000  # max(64 KB, rate × 1 ms)
    assert emulate.burst_bytes(10e9 / 8) == 1_250_000


def test_queue_holds_50_ms_and_at_least_four_bursts():
    assert emulate.limit_bytes(1e9 / 8) == 6_250_000  # 50 ms at 1 Gbit/s > 4 × 125 KB
    assert emulate.limit_bytes(1e6 / 8) == 4 * 64_000  # a slow link: 4 bursts


def test_cluster_spec_describes_the_emulation():
    emu = emulate.Emulated(name="x", hosts=4, rate_bytes_per_s=1e9 / 8, subnet=3)
    c = emu.cluster_spec(shared_cores=2)
    assert c.nodes == 4 and c.shared_cores == 2 and c.nic.bandwidth_bytes_per_s == 1e9 / 8
    assert c.comm_cpu_s_per_byte == emulate.COMM_CPU_S_PER_BYTE > 0  # moving bytes costs the shared cores
    assert emu.address(0) == "10.77.3.1"


@needs_root
def test_up_shapes_and_down_removes_everything():
    emu = emulate.up(2, "100Mbit", "t-shape")
    try:
        assert emulate.find("t-shape").hosts == 2
        assert emu.netns_path(1).exists() and emu.netns_path(1).name == emu.host(1)  # what setns(2) opens
        rate = emulate.measure_rate(emu, nbytes=3_000_000)
        # shaped: below the line rate (unshaped, the path moves ~21 Gbit/s), and not far below it; a
        # quarter-second stream on a host-slowed machine read 0.84, so this is not the payload figure:
        # validate measures that over seconds (0.95-0.96)
        assert 0.7 < rate / emu.rate_bytes_per_s < 1.0
    finally:
        assert emulate.down("t-shape") == 3
    assert not [n for n in emulate.namespaces() if "t-shape" in n]
    assert emulate.down("t-shape") == 0  # idempotent


def _class_packets(emu, where: list[str], dev: str) -> dict[str, int]:
    """Packets sent per htb class of ``dev``'s egress (``tc -s class show``)."""
    out = subprocess.run([*where, "tc", "-s", "class", "show", "dev", dev], capture_output=True, text=True,
                         check=True).stdout
    sent, cls = {}, None
    for line in out.splitlines():
        words = line.split()
        if words[:2] == ["class", "htb"]:
            cls = words[2]
        elif words[:1] == ["Sent"] and cls:
            sent[cls] = int(words[3])
    return sent


@needs_root
def test_acknowledgements_go_ahead_of_the_queued_data():
    """A one-way stream: its data leaves the sender by the bulk band, its acknowledgements leave
    the receiver (and the switch port towards the sender) by the priority band."""
    emu = emulate.up(2, "100Mbit", "t-ack")
    try:
        emulate.measure_rate(emu, nbytes=1_000_000)
        sender, receiver = _class_packets(emu, emu.exec_prefix(0), "eth0"), _class_packets(emu, emu.exec_prefix(1), "eth0")
        port = _class_packets(emu, ["ip", "netns", "exec", emu.switch], "p0")  # the switch towards the sender
        assert sender["10:20"] > 600 > sender["10:10"]  # 1 MB of data in ~1.5 kB packets: bulk
        assert receiver["10:10"] > 100 > receiver["10:20"]  # its acknowledgements: priority
        assert port["10:10"] > 100 > port["10:20"]
    finally:
        emulate.down("t-ack")


@needs_root
def test_interrupted_run_leaves_no_namespace_or_process(tmp_path):
    script = tmp_path / "hold.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "from layerplan.runtime import emulate\n"
        "with emulate.running(2, '1Gbit', 't-intr') as emu:\n"
        "    procs = [subprocess.Popen([*emu.exec_prefix(i), 'sleep', '300']) for i in range(2)]\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(300)\n"
    )
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 10  # `ip netns exec` enters the host's namespace after Popen returns
    while len(emulate.pids("t-intr")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(emulate.pids("t-intr")) == 2
    p.send_signal(signal.SIGINT)
    p.wait(timeout=30)
    time.sleep(0.2)
    assert not [n for n in emulate.namespaces() if "t-intr" in n]
    assert emulate.pids("t-intr") == []


@needs_root
@pytest.mark.dist
def test_moving_bytes_between_hosts_costs_cpu():
    with emulate.running(2, "1Gbit", "t-cpu") as emu:
        m = emulate.measure_link_cpu(emu)  # 2 s of messages: ~0.1 s of CPU, well above idle noise
    assert 1e-11 < m["cpu_s_per_byte"] < 1e-7  # a CPU moved the bytes: between 10 MB/s and 100 GB/s of it
    # at most the line rate; the lower bound allows a host-slowed machine (one 2 s stream read 0.64
    # of it): the payload figure, 0.955 of the line, is validate's, measured over more seconds
    assert 0.5 < m["rate_bytes_per_s"] / emu.rate_bytes_per_s < 1.0


@needs_root
@pytest.mark.dist
def test_the_link_measured_one_way_and_both_ways_at_once():
    with emulate.running(2, "1Gbit", "t-dup") as emu:
        m = emulate.measure_duplex(emu, seconds=0.2, repeats=1)
    assert m["bytes"] == pytest.approx(0.2 * emu.rate_bytes_per_s, rel=0.01)
    for k in ("p2p_s", "allreduce_s"):  # the shaped link bounds both: S bytes each way, the tbf burst aside,
        assert m[k] > (m["bytes"] - emulate.burst_bytes(emu.rate_bytes_per_s)) / emu.rate_bytes_per_s  # at line rate
    assert m["p2p_cpu_s"] >= 0 and m["allreduce_cpu_s"] >= 0  # the machine's busy CPU in each
    assert m["p2p_cpu_s"] + m["allreduce_cpu_s"] > 0  # ~40 ms of it: a few of /proc/stat's 10 ms ticks


@needs_root
@pytest.mark.dist
def test_flows_leaving_one_host_together_are_timed():
    with emulate.running(3, "1Gbit", "t-lead") as emu:
        m = emulate.measure_flow_lead(emu, sizes=(1_000_000,), repeats=2)
    assert m["receivers"] == 2 and m["sizes_bytes"] == [1_000_000] and len(m["first_over_last"][0]) == 2
    assert all(0 < f <= 1 for f in m["first_over_last"][0])  # the first in is never after the last
    assert 0 <= m["flow_lead_bytes"] <= 1_000_000 * (2 / 3) ** 2


def test_the_emulated_cluster_states_its_tbf_bucket():
    """The emulation's ClusterSpec carries its links' tbf burst (max(64 kB, rate × 1 ms))."""
    emu = emulate.Emulated(name="t", hosts=2, rate_bytes_per_s=1.25e9, subnet=0)
    assert emu.cluster_spec().nic.burst_bytes == emulate.burst_bytes(1.25e9) == pytest.approx(1.25e6)


def test_the_emulated_cluster_gives_its_shared_cores_the_presets_capacities():
    """Without a calibration the emulation's shared cores give the presets' cores' worth with all
    busy and with more processes than cores (hardware.SHARED_CORE_SHARE, OVERSUBSCRIBED_CORE_SHARE),
    so a CPU-bound step is predicted slower than with the cores' full count; a calibration's own
    capacities replace them."""
    from dataclasses import replace

    from layerplan import hardware, validate
    from layerplan.runtime.predict import predict_run
    from layerplan.runtime.run_spec import RunSpec

    emu = emulate.Emulated(name="t", hosts=4, rate_bytes_per_s=1.25e9, subnet=0)
    c = emu.cluster_spec(shared_cores=2)
    assert c.shared_core_capacity == pytest.approx(2 * hardware.SHARED_CORE_SHARE)
    assert c.oversubscribed_core_capacity == pytest.approx(2 * hardware.OVERSUBSCRIBED_CORE_SHARE)
    spec = RunSpec(model="resnet_cifar", strategy="allreduce", config={"workers": 4}, batch_size=16)
    full = replace(c, shared_core_capacity=None, oversubscribed_core_capacity=None)
    assert predict_run(spec, c)["step_time_s"] > 1.05 * predict_run(spec, full)["step_time_s"]
    n = emu.cluster_spec().shared_cores  # this machine's cores, as calibrated_for sees them
    calibrated = replace(c, shared_cores=n, shared_core_capacity=0.75 * n, oversubscribed_core_capacity=0.7 * n)
    mine = validate.calibrated_for(emu, calibrated)
    assert (mine.shared_core_capacity, mine.oversubscribed_core_capacity) == pytest.approx((0.75 * n, 0.7 * n))


def test_one_shared_core_keeps_its_own_capacity():
    """One core has no other to contend with: the presets leave its capacity at the core's."""
    from layerplan import hardware

    assert hardware.shared_cores_preset(1) == {"shared_cores": 1}
    assert hardware.shared_cores_preset(None) == {"shared_cores": None}
    assert hardware.shared_cores_preset(4)["shared_core_capacity"] == pytest.approx(3.6)
    assert hardware.cluster("local-cpu", shared_cores=4).oversubscribed_core_capacity == pytest.approx(3.44)


def test_without_root_validate_runs_itself_again_in_a_user_namespace(monkeypatch):
    """Not root, where user namespaces work: the command is run again, now, as the root of one
    (this process becomes it), its clusters recorded inside the namespace's own /run."""
    calls = []
    monkeypatch.setattr(emulate.os, "geteuid", lambda: 1000)
    monkeypatch.delenv(emulate.USERNS_ENV, raising=False)
    monkeypatch.setattr(emulate.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(emulate, "user_namespace_works", lambda: True)
    monkeypatch.setattr(emulate.os, "execvpe", lambda f, argv, env: calls.append((f, argv, env)))
    emulate.in_user_namespace(["python", "-m", "layerplan", "validate", "--quick"])
    (f, argv, env), = calls
    assert f == "unshare" and argv[:4] == ["unshare", "-Urnm", "--propagation", "private"]
    assert argv[7:] == ["sh", "python", "-m", "layerplan", "validate", "--quick"]
    assert emulate.USERNS_SETUP in argv[6] and env["LAYERPLAN_STATE_DIR"] == emulate.USERNS_STATE_DIR
    assert env[emulate.USERNS_ENV] == "1"


def test_without_root_or_a_user_namespace_the_reason_is_given(monkeypatch):
    monkeypatch.setattr(emulate.os, "geteuid", lambda: 1000)
    monkeypatch.delenv(emulate.USERNS_ENV, raising=False)
    monkeypatch.setattr(emulate.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(emulate, "user_namespace_works", lambda: False)
    monkeypatch.setattr(emulate.os, "execvpe", lambda *a: pytest.fail("ran again where no namespace can be made"))
    with pytest.raises(emulate.EmulationError, match="cannot make an unprivileged user namespace"):
        emulate.in_user_namespace(["layerplan", "validate"])
    monkeypatch.setattr(emulate, "user_namespace_works", lambda: True)  # cluster up: the recipe to run it in one
    with pytest.raises(emulate.EmulationError, match="unshare -Urnm --propagation private sh -c 'mount -t tmpfs"):
        emulate.check_available()


def test_validate_without_root_or_namespaces_stops_before_calibrating(monkeypatch, capsys):
    from layerplan import calibrate, cli

    monkeypatch.setattr(emulate.os, "geteuid", lambda: 1000)
    monkeypatch.delenv(emulate.USERNS_ENV, raising=False)
    monkeypatch.setattr(emulate, "user_namespace_works", lambda: False)
    monkeypatch.setattr(calibrate, "calibrate", lambda *a, **k: pytest.fail("calibrated before saying it cannot run"))
    assert cli.main(["validate", "--quick", "--out", "/nonexistent/v"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("layerplan validate: error: the emulated cluster needs root") and "\n" == err[-1]


@pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("ip") is None or shutil.which("tc") is None
                    or not emulate.user_namespace_works(), reason="no user namespace can be made here (unshare -Urn)")
def test_a_user_namespace_builds_a_cluster_and_leaves_nothing_behind():
    """What ``in_user_namespace`` runs: a cluster made inside the namespace, recorded in its /run,
    gone with it — no namespace or record of it outside."""
    script = ("import os; from layerplan.runtime import emulate as e; e.check_available(); "
              "emu = e.up(2, '100Mbit', 't-userns'); print(e.STATE_DIR, len(e.namespaces()), "
              "round(e.measure_rate(emu, nbytes=3_000_000) / emu.rate_bytes_per_s, 3)); "
              "import socket; socket.create_server(('127.0.0.1', 0)).close()")  # loopback is up
    env = {**os.environ, emulate.USERNS_ENV: "1", "LAYERPLAN_STATE_DIR": emulate.USERNS_STATE_DIR}
    r = subprocess.run(emulate.user_namespace_argv([sys.executable, "-c", script]), capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    state_dir, made, share = r.stdout.split()
    assert state_dir == emulate.USERNS_STATE_DIR and int(made) == 3 and 0.7 < float(share) < 1.0  # shaped
    assert not [n for n in emulate.namespaces() if "t-userns" in n]
    assert not (emulate.STATE_DIR / "t-userns.json").exists()
