"""An emulated cluster on one machine: network namespaces on a bridge, real bandwidth limits.

Each host is a network namespace with one interface (``eth0``, 10.77.<k>.<i+1>/24) joined by a
veth pair to a bridge that lives in its own namespace, so the machine never routes into the test
subnet. A token-bucket filter (tbf) shapes both ends of every host's link — the host's egress and
the switch port's egress towards it — so each host gets R in and R out, like a switch port
(EMULATION.md). tbf burst ≥ max(64 KB, R × 1 ms) and limit ≥ 4 × burst, here also ≥ 50 ms of
traffic at R (``QUEUE_S``); a burst below the MTU drops every packet silently. Inside the tbf, TCP
acknowledgements go ahead of the queued data (``_tc``), so a link carries R both ways at once.

Root is needed for ``ip netns``; without root, layerplan runs inside an unprivileged user namespace
(``unshare -Urnm --propagation private``, a tmpfs on /run, ``mkdir /run/netns``) where the same
recipe works and vanishes with the namespace (EMULATION.md): ``validate`` starts itself in one
(``in_user_namespace``); ``cluster up`` and ``train --on emulated`` run in one a user makes. ``runtime.launch.launch_emulated``
runs a training run's rank r in host r.
Nothing is left behind: ``down`` is idempotent and kills every process still in a host, and the
context manager tears the cluster down on exit, on exceptions and on SIGINT/SIGTERM.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from layerplan import units
from layerplan.errors import LayerplanError

PREFIX = "layerplan"
STATE_DIR = Path(os.environ.get("LAYERPLAN_STATE_DIR", "/tmp/layerplan-emulated"))
MTU_BYTES = 1500
NETNS_DIRS = (Path("/run/netns"), Path("/var/run/netns"))  # iproute2's NETNS_RUN_DIR


class EmulationError(LayerplanError):
    """The emulated cluster cannot be built, found or used here."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Emulated:
    """A running emulated cluster."""

    name: str
    hosts: int
    rate_bytes_per_s: float
    """Configured line rate of every host's link (each direction)."""
    subnet: int
    """k in 10.77.k.0/24."""

    @property
    def switch(self) -> str:
        return f"{PREFIX}-{self.name}-sw"

    def host(self, i: int) -> str:
        return f"{PREFIX}-{self.name}-h{i}"

    def address(self, i: int) -> str:
        return f"10.77.{self.subnet}.{i + 1}"

    def to_dict(self) -> dict:
        return {"name": self.name, "hosts": self.hosts, "rate_bytes_per_s": self.rate_bytes_per_s, "subnet": self.subnet}

    def netns_path(self, i: int) -> Path:
        """The file that names host i's network namespace (what ``ip netns exec`` opens; setns(2))."""
        for d in NETNS_DIRS:
            if (d / self.host(i)).exists():
                return d / self.host(i)
        return NETNS_DIRS[0] / self.host(i)

    def exec_prefix(self, i: int) -> list[str]:
        """argv prefix that runs a command inside host i."""
        return ["ip", "netns", "exec", self.host(i)]

    def cluster_spec(self, device=None, shared_cores: int | None = None):
        """The ClusterSpec this emulation stands for: its link rate (TCP payload efficiency as
        measured here, EMULATION.md: ≈ 0.956) and tbf bucket (``burst_bytes``), one CPU device per
        host (``hardware.local_device``: a core of this machine by its /proc/cpuinfo), the cores
        every host shares (the machine's, with the presets' capacities: ``hardware.shared_cores_preset``)
        and the CPU moving a byte through the emulated path costs them (``COMM_CPU_S_PER_BYTE``)."""
        from layerplan import hardware

        nic = hardware.LinkSpec(name=f"emulated {units.format_bandwidth(self.rate_bytes_per_s)}",
                                bandwidth_bytes_per_s=self.rate_bytes_per_s, latency_s=90e-6, efficiency=0.956,
                                flow_lead_bytes=FLOW_LEAD_BYTES, burst_bytes=burst_bytes(self.rate_bytes_per_s),
                                note="tbf-shaped veth on this machine")
        return hardware.ClusterSpec(name=f"emulated:{self.name}", nodes=self.hosts, device=device or hardware.local_device(),
                                    nic=nic, comm_cpu_s_per_byte=COMM_CPU_S_PER_BYTE,
                                    **hardware.shared_cores_preset(shared_cores or os.cpu_count() or 1))


COMM_CPU_S_PER_BYTE = 0.6e-9
"""``ClusterSpec.comm_cpu_s_per_byte`` of the emulated cluster without a calibration: CPU seconds each
end of a message spends per byte on the shaped path (veth, bridge, tbf, TCP, gloo's copies), taken
from the cores every host shares. ``validate`` measures both ends' per rate from /proc/stat
(``link_cpu_s_per_byte``): 1.0 ns/B at 1 and 10 Gbit/s on the host of the README's earlier runs;
1.2–1.3 at 10 Gbit/s and 1.6–2.3 at 1 Gbit/s on the host of vf97–vf99 (4–13 at 100 Mbit/s on
both, where the link, not the CPU, bounds a step). Without it the presets had every byte free:
vgg16_cifar's 10 Gbit/s rows of vf97 and vf98 ran 24–27% slower than the presets said (median),
with it 10–15%."""

FLOW_LEAD_BYTES = 150e3
"""``LinkSpec.flow_lead_bytes`` of the emulated link: 4 gloo sends of S bytes from one host at once,
the first done at 0.58 / 0.67 / 0.83 / 0.94 / 0.95 (1 Gbit/s, medians of 8) and 0.61 / 0.72 / 0.66 /
0.94 (100 Mbit/s, of 5) of the fair time for S = 0.27 / 1.1 / 4.4 / 17 / 60 MB: leads of 0.15-4 MB,
≈ √(150 kB · S). What the ps and RALP schedules use where a link's own was not measured; one
``measure_flow_lead`` each (1 and 4 MB, 4 receivers, 5 repeats) read 103 kB at 1 Gbit/s, 291 kB at
100 Mbit/s and 585 kB at 10 Gbit/s."""


def burst_bytes(rate_bytes_per_s: float) -> int:
    """tbf burst: ≥ max(64 KB, rate × 1 ms) (EMULATION.md)."""
    return int(max(64_000, rate_bytes_per_s * 1e-3, 2 * MTU_BYTES))


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise EmulationError(f"`ip {' '.join(args)}` failed: {r.stderr.strip() or r.stdout.strip()}")
    return r


QUEUE_S = 0.05
"""The tbf queue holds this long at the link rate (the limit is at least 4 × burst, EMULATION.md).
A shallower queue drops packets when a few workers push to one host at once, and TCP waits out
its 200 ms minimum retransmission timeout: measured at 1 Gbit/s with the 4 × burst limit
(500 KB), 4 × 1 MB into one host took 37 ms in most rounds and 228 ms in one of ten; with 50 ms
of queue every round takes the 37 ms the link rate gives (4 × 10 MB at 1 Gbit/s, 4 × 1 MB at
100 Mbit/s alike). The emulated link is a clean bandwidth limit, the network the cost model
describes; on a real shallow-buffered switch such incast adds retransmission stalls on top."""


def limit_bytes(rate_bytes_per_s: float) -> int:
    """tbf limit: max(4 × burst (EMULATION.md), QUEUE_S of traffic)."""
    return int(max(4 * burst_bytes(rate_bytes_per_s), rate_bytes_per_s * QUEUE_S))


ACK_BYTES = 128
"""IPv4 TCP packets shorter than this (pure acknowledgements: 52–84 bytes with timestamps and SACK
blocks) go ahead of the bulk data queued in a link's tbf (``_tc``)."""


def _tc(ns: str, dev: str, rate_bytes_per_s: float) -> None:
    """Shape ``dev``'s egress to the rate: tbf, and under it two bands — acknowledgements first,
    then everything else in a FIFO of ``limit_bytes``. With one FIFO, a host sending and receiving
    at once queued the acknowledgements of its incoming streams behind up to ``QUEUE_S`` of its
    own outgoing data, and the incoming streams slowed. Measured (gloo messages, 20 MB each way
    split over the streams, median of 3, against 20 MB one way): at 100 Mbit/s, 2 streams out and
    2 in took 1.11×, 3 out and 1 in 1.61×; at 1 Gbit/s, 1 out and 3 in 1.40×, 1 and 1 1.19×. With
    the acknowledgements first, every mix of 1–3 streams each way took 1.00–1.03× at 100 Mbit/s,
    and 1.01–1.05× at 1 Gbit/s but for one stream each way (1.27× there, where gloo's two-host
    all-reduce, ``measure_duplex``, reads 1.00), as on a real host, whose default queue (fq_codel)
    serves a sparse acknowledgement flow ahead of bulk ones. tbf's child is htb, used only for its
    strict priority (its classes' rates are above the link's: tbf shapes); a u32 filter picks the
    acknowledgements (fq_codel itself is not in every kernel: not in this one)."""
    burst = burst_bytes(rate_bytes_per_s)
    rate_bit = int(rate_bytes_per_s * 8)
    tc = ("netns", "exec", ns, "tc")
    _ip(*tc, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "tbf", "rate", f"{rate_bit}bit",
        "burst", str(burst), "limit", str(limit_bytes(rate_bytes_per_s)))
    above = f"{2 * rate_bit}bit"
    _ip(*tc, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "htb", "default", "20")
    _ip(*tc, "class", "add", "dev", dev, "parent", "10:", "classid", "10:10", "htb", "rate", above, "prio", "0")
    _ip(*tc, "class", "add", "dev", dev, "parent", "10:", "classid", "10:20", "htb", "rate", above, "prio", "1")
    _ip(*tc, "qdisc", "add", "dev", dev, "parent", "10:20", "handle", "20:", "bfifo",
        "limit", str(limit_bytes(rate_bytes_per_s)))
    _ip(*tc, "filter", "add", "dev", dev, "parent", "10:", "protocol", "ip", "prio", "1", "u32",
        "match", "ip", "protocol", "6", "0xff",  # TCP
        "match", "u16", "0x0000", f"{0xffff & ~(ACK_BYTES - 1):#06x}", "at", "2",  # IPv4 total length < ACK_BYTES
        "flowid", "10:10")


USERNS_ENV = "LAYERPLAN_IN_USERNS"
"""Set (to 1) in a command ``in_user_namespace`` started: it runs as the namespace's root."""
USERNS_SETUP = "mount -t tmpfs tmpfs /run && mkdir -p /run/netns && ip link set lo up"
"""What a new user namespace needs before ``ip netns add`` works in it: a /run of its own (the
machine's belongs to the real root), with iproute2's folder of named namespaces; and, its network
being new, loopback up (the calibration's ranks meet over it)."""
USERNS_STATE_DIR = "/run/layerplan-emulated"
"""Where a user namespace's clusters are recorded: inside its own /run, so no record outlives them."""


def user_namespace_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` run as root of a new unprivileged user namespace with its own network and mounts
    (``unshare -Urnm``), after ``USERNS_SETUP``: every namespace, link and process it makes
    vanishes with it (EMULATION.md). ``unshare`` without --fork execs, so the command keeps its
    process (a signal to it reaches the command)."""
    return ["unshare", "-Urnm", "--propagation", "private", "sh", "-c", f'{USERNS_SETUP} && exec "$@"', "sh", *argv]


@functools.lru_cache(maxsize=1)
def user_namespace_works() -> bool:
    """Whether this user may make an unprivileged user namespace with its own network here (the
    kernel and its settings allow it, and ``unshare`` is installed)."""
    if shutil.which("unshare") is None:
        return False
    try:
        r = subprocess.run(user_namespace_argv(["ip", "link", "show", "lo"]), capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def check_available() -> None:
    """Raise EmulationError with the reason when namespaces cannot be made here."""
    if shutil.which("ip") is None:
        raise EmulationError("the emulated cluster needs iproute2 (`ip`); install it (apt-get install iproute2)")
    if shutil.which("tc") is None:
        raise EmulationError("the emulated cluster needs `tc` (iproute2)")
    if os.geteuid() != 0:
        how = ("layerplan validate makes one by itself; for cluster up / train --on emulated, run them in one "
               f"namespace: unshare -Urnm --propagation private sh -c '{USERNS_SETUP} && layerplan cluster up ... "
               "&& layerplan train ... --on emulated'" if user_namespace_works() else
               "this user cannot make an unprivileged user namespace here either (unshare -Urn failed: the kernel "
               "or its settings, e.g. user.max_user_namespaces, forbid it)")
        raise EmulationError(f"the emulated cluster needs root for network namespaces, or a user namespace: {how}")


def in_user_namespace(argv: Sequence[str]) -> None:
    """Make sure namespaces can be made for a command that builds its own clusters (``validate``):
    as root, check the tools; otherwise run ``argv`` again, now, as root of a user namespace
    (``user_namespace_argv``; its clusters recorded in ``USERNS_STATE_DIR``) — this process
    becomes it and does not return; where that is impossible, EmulationError says why."""
    if os.geteuid() == 0 or os.environ.get(USERNS_ENV):
        check_available()
        return
    if shutil.which("ip") is None or shutil.which("tc") is None:
        check_available()  # its message names the missing tool
    if not user_namespace_works():
        check_available()  # its message says why not
    env = {**os.environ, USERNS_ENV: "1", "LAYERPLAN_STATE_DIR": USERNS_STATE_DIR}
    print("layerplan: not root: running in an unprivileged user namespace (unshare -Urnm); its emulated clusters "
          "vanish with it", file=sys.stderr, flush=True)
    cmd = user_namespace_argv(argv)
    os.execvpe(cmd[0], cmd, env)


def _state_file(name: str) -> Path:
    return STATE_DIR / f"{name}.json"


def namespaces() -> list[str]:
    r = _ip("netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _validate_name(name: str) -> None:
    if not name or not all(ch.isalnum() or ch in "-_" for ch in name) or len(name) > 24:
        raise EmulationError(f"cluster name {name!r}: use up to 24 letters, digits, '-' or '_'")


def up(hosts: int, rate: str | float, name: str = "default") -> Emulated:
    """Create the cluster (replacing one of the same name)."""
    _validate_name(name)
    if not isinstance(hosts, int) or hosts < 1 or hosts > 200:
        raise EmulationError(f"--hosts must be between 1 and 200, got {hosts}")
    rate_b = units.parse_bandwidth(rate, "--bandwidth") if isinstance(rate, str) else float(rate)
    check_available()
    down(name)
    used = {json.loads(p.read_text()).get("subnet") for p in STATE_DIR.glob("*.json")} if STATE_DIR.exists() else set()
    subnet = next(k for k in range(1, 255) if k not in used)
    emu = Emulated(name=name, hosts=hosts, rate_bytes_per_s=rate_b, subnet=subnet)
    try:
        _ip("netns", "add", emu.switch)
        _ip("-n", emu.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", emu.switch, "link", "set", "br0", "up")
        for i in range(hosts):
            ns = emu.host(i)
            _ip("netns", "add", ns)
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}", "netns", emu.switch)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "addr", "add", f"{emu.address(i)}/24", "dev", "eth0")
            _ip("-n", emu.switch, "link", "set", f"p{i}", "master", "br0", "up")
            _tc(ns, "eth0", rate_b)  # the host's egress
            _tc(emu.switch, f"p{i}", rate_b)  # the switch port towards the host: the host's ingress
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        _state_file(name).write_text(json.dumps(emu.to_dict()))
    except BaseException:
        down(name)
        raise
    return emu


def find(name: str = "default") -> Emulated:
    p = _state_file(name)
    if not p.exists() or f"{PREFIX}-{name}-sw" not in namespaces():
        raise EmulationError(f"no emulated cluster named {name!r} is up; start one: layerplan cluster up --hosts 4 "
                             f"--bandwidth 1Gbit --name {name}")
    return Emulated(**json.loads(p.read_text()))


def pids(emu_name: str) -> list[int]:
    out = []
    for ns in namespaces():
        if ns.startswith(f"{PREFIX}-{emu_name}-"):
            r = _ip("netns", "pids", ns, check=False)
            out += [int(x) for x in r.stdout.split() if x.isdigit()]
    return out


def down(name: str = "default") -> int:
    """Kill what runs in the cluster's hosts and delete its namespaces. Idempotent; returns the
    number of namespaces removed."""
    if shutil.which("ip") is None:
        return 0
    for pid in pids(name):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    removed = 0
    for ns in namespaces():
        if ns.startswith(f"{PREFIX}-{name}-"):
            _ip("netns", "del", ns, check=False)
            removed += 1
    for _ in range(20):  # a deletion that failed (a killed process still exiting in it) is tried again
        left = [ns for ns in namespaces() if ns.startswith(f"{PREFIX}-{name}-")]
        if not left:
            break
        time.sleep(0.1)
        for ns in left:
            _ip("netns", "del", ns, check=False)
    try:
        _state_file(name).unlink()
    except FileNotFoundError:
        pass
    return removed


def status() -> list[dict]:
    """Every emulated cluster that is up, with its hosts and the processes running in them."""
    out = []
    if STATE_DIR.exists():
        for p in sorted(STATE_DIR.glob("*.json")):
            d = json.loads(p.read_text())
            alive = f"{PREFIX}-{d['name']}-sw" in namespaces()
            d["up"] = alive
            d["processes"] = len(pids(d["name"])) if alive else 0
            out.append(d)
    return out


@contextmanager
def running(hosts: int, rate: str | float, name: str | None = None) -> Iterator[Emulated]:
    """A cluster for the duration of a block: torn down on exit, exceptions, SIGINT and SIGTERM."""
    name = name or f"tmp{os.getpid()}"
    previous = {}

    def _handler(signum, frame):
        down(name)
        raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, _handler)
        except ValueError:  # not the main thread
            pass
    try:
        yield up(hosts, rate, name)
    finally:
        down(name)
        for sig, h in previous.items():
            signal.signal(sig, h)


def host_env(emu: Emulated, rank: int, world: int, master: int = 0, port: int = 29500) -> dict[str, str]:
    """Environment of a rank in host ``rank``: gloo on the host's interface (mandatory inside the
    namespaces, where the hostname resolves to 127.0.0.1)."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": emu.address(master), "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": "eth0", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def measure_rate(emu: Emulated, src: int = 0, dst: int = 1, nbytes: int = 20_000_000, python: Sequence[str] = ("python3",)) -> float:
    """Payload bytes/s of one TCP stream from host src to host dst (plain sockets, no torch)."""
    if emu.hosts < 2:
        raise EmulationError("measuring a link needs at least 2 hosts")
    port = 29400
    server = ("import socket,time;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
              f"s.bind(('{emu.address(dst)}',{port}));s.listen(1);c,_=s.accept();n=0;t=None\n"
              "while True:\n b=c.recv(1<<20)\n if t is None: t=time.perf_counter()\n if not b: break\n n+=len(b)\n"
              "print(n/(time.perf_counter()-t))")
    client = ("import socket,time;time.sleep(0.3);s=socket.create_connection(("
              f"'{emu.address(dst)}',{port}));buf=b'x'*(1<<20);left={nbytes}\n"
              "while left>0:\n s.sendall(buf[:min(left,len(buf))]); left-=min(left,len(buf))\n"
              "s.close()")
    srv = subprocess.Popen([*emu.exec_prefix(dst), *python, "-c", server], stdout=subprocess.PIPE, text=True)
    cli = subprocess.run([*emu.exec_prefix(src), *python, "-c", client], capture_output=True, text=True, timeout=120)
    out, _ = srv.communicate(timeout=120)
    if cli.returncode != 0 or not out.strip():
        raise EmulationError(f"link measurement failed: {cli.stderr.strip()[-200:]}")
    return float(out.strip())


LINK_CPU_PORT = 29555


def measure_link_cpu(emu: Emulated, seconds: float = 2.0) -> dict[str, float]:
    """CPU seconds per payload byte that the machine spends moving gloo messages between two hosts
    at this emulation's rate — both ends, the veth pair, the bridge and the tbf qdiscs: busy CPU
    time from /proc/stat while rank 0 sends rank 1 about ``seconds`` of point-to-point messages
    (torch.distributed, as the runtime moves them), less the machine's busy share when idle (the
    least of three quarter-second windows just before). Measured here: ≈ 4–8 ns/byte at 100 Mbit/s
    (timer and wake-up work per packet at a low rate), 1.0 at 1 and 10 Gbit/s, 0.7 unshaped — a
    plain socket stream written 1 MB at a time costs twice that at 1 Gbit/s, so the messages are
    gloo's.
    Returns {"cpu_s_per_byte", "rate_bytes_per_s", "baseline_cores"}."""
    import sys

    if emu.hosts < 2:
        raise EmulationError("measuring a link needs at least 2 hosts")
    size = int(min(64 * 2**20, max(2**20, emu.rate_bytes_per_s * 0.25)))
    iters = max(2, math.ceil(seconds * min(emu.rate_bytes_per_s, 2.5e9) / size))
    code = ("import datetime,time,torch,torch.distributed as dist\n"
            "torch.set_num_threads(1);dist.init_process_group('gloo',timeout=datetime.timedelta(seconds=60))\n"
            "r=dist.get_rank()\n"
            f"t=torch.ones({size // 4})\n"
            "def one():\n dist.send(t,1) if r==0 else dist.recv(t,0)\n"
            "one();dist.barrier()\n"  # the first message opens the pair: not counted
            "print('START',flush=True);t0=time.perf_counter()\n"
            f"for _ in range({iters}): one()\n"
            "dist.barrier();print('END',time.perf_counter()-t0,flush=True)\n")
    baseline = min(_busy_share(0.25) for _ in range(3))  # the idle floor: a transient (a process
    # still exiting) in one window would pass for the machine's idle load and cancel the link's CPU
    procs = [subprocess.Popen([*emu.exec_prefix(i), sys.executable, "-c", code], text=True,
                              env={**os.environ, **host_env(emu, i, 2, port=LINK_CPU_PORT)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
    try:
        line = procs[0].stdout.readline()
        b0 = busy_cpu_s()
        end = procs[0].stdout.readline()
        busy = busy_cpu_s() - b0
        outs = [p.communicate(timeout=120) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise EmulationError("link CPU measurement timed out (120 s)") from None
    if not (line.startswith("START") and end.startswith("END")) or any(p.returncode for p in procs):
        err = " ".join(o[1].strip().splitlines()[-1] for o in outs if o[1].strip())
        raise EmulationError(f"link CPU measurement failed: {err[-200:] or 'no output'}")
    wall_s = float(end.split()[1])
    nbytes = size * iters
    return {"cpu_s_per_byte": max(0.0, busy - baseline * wall_s) / nbytes, "rate_bytes_per_s": nbytes / wall_s,
            "baseline_cores": baseline}


DUPLEX_PORT = 29556


def measure_duplex(emu: Emulated, seconds: float = 1.0, repeats: int = 3) -> dict[str, float]:
    """The link one way and both ways at once, as gloo moves bytes between two hosts: the median
    time of a point-to-point message of S bytes (about ``seconds`` at this rate) and of an
    all-reduce of S bytes over the 2 hosts (gloo's ring: each host sends and receives S/2 at once,
    twice), alternating, ``repeats`` times. Measured here at 100 Mbit/s (25 MB): the all-reduce
    takes 1.02–1.08× the message (the acknowledgements of one direction's stream ride the other;
    1.015 with the acknowledgements ahead of the data, ``_tc``; 1.00 at 1 Gbit/s).
    Split in four launched at once, as DDP's buckets go, the same bytes took 1.09–1.14×, more than
    DDP's steps lost (4–7% against the model's full duplex): fitted to it, the model over-corrected
    them by as much. The machine's busy CPU seconds in each (/proc/stat, both hosts, the median
    over the repeats) give the reduction's CPU on this path (``validate.reduce_cpu_s_per_byte``).
    Returns {"bytes", "p2p_s", "allreduce_s", "p2p_cpu_s", "allreduce_cpu_s"}."""
    if emu.hosts < 2:
        raise EmulationError("measuring a link needs at least 2 hosts")
    size = int(min(256 * 2**20, max(2**20, emu.rate_bytes_per_s * seconds))) // 4 * 4
    code = ("import datetime,json,os,statistics,time,torch,torch.distributed as dist\n"
            "torch.set_num_threads(1);dist.init_process_group('gloo',timeout=datetime.timedelta(seconds=120))\n"
            f"r=dist.get_rank();t=torch.ones({size // 4});p,a,pc,ac=[],[],[],[]\n"
            "def one():\n dist.send(t,1) if r==0 else dist.recv(t,0)\n"
            "def busy():\n v=[int(x) for x in open('/proc/stat').readline().split()[1:9]]\n"
            " return (sum(v)-v[3]-v[4])/os.sysconf('SC_CLK_TCK')\n"
            "def timed(f,cpu):\n dist.barrier();t0=time.perf_counter();b0=busy();f();dist.barrier()\n"
            " cpu.append(busy()-b0);return time.perf_counter()-t0\n"
            "one();dist.all_reduce(t)\n"  # the pair opened, both ways: not counted
            f"for _ in range({repeats}): p.append(timed(one,pc));a.append(timed(lambda: dist.all_reduce(t),ac))\n"
            "m=statistics.median;print(json.dumps([m(p),m(a),m(pc),m(ac)]),flush=True)\n"
            "dist.barrier();dist.destroy_process_group()\n")  # else gloo's threads may abort the exit
    p2p, allreduce, p2p_cpu, allreduce_cpu = _rank0_json(emu, code, 2, DUPLEX_PORT,
                                                         120 + 4 * repeats * size / emu.rate_bytes_per_s,
                                                         "link duplex measurement")
    return {"bytes": float(size), "p2p_s": p2p, "allreduce_s": allreduce, "p2p_cpu_s": p2p_cpu,
            "allreduce_cpu_s": allreduce_cpu}


BUSY_RING_PORT = 29558
BUSY_RING_ROUND_S = 0.25
"""A round of ``measure_busy_ring``'s all-reduce takes about this long at the link's rate."""


def measure_busy_ring(emu: Emulated, window_s: float = 2.0) -> dict[str, float]:
    """CPU seconds a byte of a ring all-reduce takes from its own ranks' compute (ClusterSpec.
    ``collective_busy_cpu_s_per_byte``): two hosts' ranks (one thread each) run a convolution's
    forward and backward in a loop, first alone for ``window_s``, then while a thread of each
    all-reduces a buffer of about ``BUSY_RING_ROUND_S`` of the link's bytes round after round (as
    DDP's buckets go beside the backward), until both have seen ``window_s`` pass. The compute's
    passes lost, in cores (one a rank), over the bytes the ranks sent a second. Measured here
    (``benchmarks/ring_in_busy_ranks.py``, vgg16_cifar's conv head): 1.7-2.0 ns a byte at 1 Gbit/s,
    where the same bytes cost 0.66 on idle cores; 1.0-1.1 at 10 Gbit/s.
    Returns {"cpu_s_per_byte", "lost_cores", "sent_bytes_per_s", "pace_ratio"}."""
    if emu.hosts < 2:
        raise EmulationError("measuring a ring needs at least 2 hosts")
    floats = int(min(16 * 2**20, max(2**18, BUSY_RING_ROUND_S * emu.rate_bytes_per_s / 4)))
    code = ("import datetime,json,threading,time,torch,torch.distributed as dist\n"
            "torch.set_num_threads(1);dist.init_process_group('gloo',timeout=datetime.timedelta(seconds=120))\n"
            "x=torch.randn(16,128,16,16,requires_grad=True);conv=torch.nn.Conv2d(128,128,3,padding=1)\n"
            "def compute(): conv(x).sum().backward()\n"
            f"buf=torch.ones({floats});flag=torch.zeros(1);W={float(window_s)!r}\n"
            "def ring(t0,out):\n"
            " n=0\n"
            " while True:\n"
            "  dist.all_reduce(buf);n+=1\n"
            "  flag[0]=float(time.perf_counter()-t0<W);dist.all_reduce(flag,op=dist.ReduceOp.MIN)\n"
            "  if flag[0]==0: break\n"
            " out['rounds'],out['s']=n,time.perf_counter()-t0\n"
            "compute();compute();dist.barrier()\n"
            "t0=time.perf_counter();k=0\n"
            "while time.perf_counter()-t0<W: compute();k+=1\n"
            "alone=k/(time.perf_counter()-t0);dist.barrier()\n"
            "res={};t0=t1=time.perf_counter();th=threading.Thread(target=ring,args=(t0,res));th.start();k=0\n"
            "while th.is_alive(): compute();k+=1;t1=time.perf_counter()\n"
            "th.join();both=k/(t1-t0)\n"
            "out=[None]*dist.get_world_size();dist.all_gather_object(out,[alone,both,res['rounds']*buf.numel()*4/res['s']])\n"
            "if dist.get_rank()==0: print(json.dumps(out),flush=True)\n"
            "dist.barrier();dist.destroy_process_group()\n")
    per_rank = _rank0_json(emu, code, 2, BUSY_RING_PORT, 120 + 10 * window_s, "ring measurement")
    pace = sum(r[1] for r in per_rank) / sum(r[0] for r in per_rank)
    lost_cores = max(0.0, 1.0 - pace) * len(per_rank)
    sent = sum(r[2] for r in per_rank)  # a 2-rank ring sends its buffer once from each rank
    return {"cpu_s_per_byte": lost_cores / sent if sent > 0 else 0.0, "lost_cores": lost_cores,
            "sent_bytes_per_s": sent, "pace_ratio": pace}


FLOW_LEAD_PORT = 29557


def measure_flow_lead(emu: Emulated, sizes: Sequence[int] = (1_000_000, 4_000_000), repeats: int = 5) -> dict:
    """How unevenly TCP shares a host's link among flows that leave it together: host 0 sends S
    bytes to each of hosts 1..n at once (n = up to 4, gloo isends, as a parameter server's pulls go)
    and each receiver notes when its message is in; per size and repeat, the first's time over the
    last's (the last ends when all n·S bytes have crossed). ``flow_lead_bytes`` is the median of
    ``hardware.fit_flow_lead_bytes`` over them. Returns {"receivers", "sizes_bytes",
    "first_over_last" (per size, per repeat), "flow_lead_bytes"}."""
    import statistics

    from layerplan import hardware

    if emu.hosts < 3:
        raise EmulationError("measuring how flows share a link needs at least 3 hosts (one sender, two receivers)")
    world = min(emu.hosts, 5)
    sizes = [int(x) // 4 * 4 for x in sizes]
    code = ("import datetime,json,time,torch,torch.distributed as dist\n"
            "torch.set_num_threads(1);dist.init_process_group('gloo',timeout=datetime.timedelta(seconds=120))\n"
            f"r=dist.get_rank();W={world};out=[]\n"
            f"for S in {sizes!r}:\n"
            " buf=torch.zeros(S//4);row=[]\n"
            f" for k in range({repeats} + 1):\n"  # the first round opens the pairs: not counted
            "  dist.barrier();t0=torch.tensor([time.monotonic()],dtype=torch.float64);dist.broadcast(t0,0)\n"
            "  if r==0:\n   [w.wait() for w in [dist.isend(buf,d) for d in range(1,W)]];mine=torch.zeros(1,dtype=torch.float64)\n"
            "  else:\n   dist.recv(buf,0);mine=torch.tensor([time.monotonic()-t0.item()],dtype=torch.float64)\n"
            "  got=[torch.zeros(1,dtype=torch.float64) for _ in range(W)];dist.all_gather(got,mine)\n"
            "  d=sorted(g.item() for g in got[1:])\n"
            "  if k: row.append(d[0]/d[-1])\n"
            " out.append(row)\n"
            "if r==0: print(json.dumps(out),flush=True)\n"
            "dist.barrier();dist.destroy_process_group()\n")
    wire_s = (world - 1) * sum(sizes) * (repeats + 1) / emu.rate_bytes_per_s
    fractions = _rank0_json(emu, code, world, FLOW_LEAD_PORT, 120 + 4 * wire_s, "flow sharing measurement")
    fits = [hardware.fit_flow_lead_bytes(world - 1, s, min(1.0, max(f, 1e-6))) for s, row in zip(sizes, fractions) for f in row]
    return {"receivers": world - 1, "sizes_bytes": sizes, "first_over_last": fractions,
            "flow_lead_bytes": statistics.median(fits)}


def _rank0_json(emu: Emulated, code: str, world: int, port: int, timeout_s: float, what: str):
    """Run ``python -c code`` as ranks 0..world−1, one per host, and return what rank 0 printed last
    (JSON); a clear EmulationError naming ``what`` when it times out or fails."""
    import sys

    procs = [subprocess.Popen([*emu.exec_prefix(i), sys.executable, "-c", code], text=True,
                              env={**os.environ, **host_env(emu, i, world, port=port)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(world)]
    try:
        outs = [p.communicate(timeout=timeout_s) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise EmulationError(f"{what} timed out") from None
    if any(p.returncode for p in procs) or not outs[0][0].strip():
        err = " ".join(o[1].strip().splitlines()[-1] for o in outs if o[1].strip())
        raise EmulationError(f"{what} failed: {err[-200:] or 'no output'}")
    return json.loads(outs[0][0].strip().splitlines()[-1])


def _busy_share(window_s: float) -> float:
    """Cores' worth of busy CPU over the next ``window_s`` seconds."""
    b0, t0 = busy_cpu_s(), time.perf_counter()
    time.sleep(window_s)
    return (busy_cpu_s() - b0) / (time.perf_counter() - t0)


def busy_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")

