"""Start a run's ranks as processes and watch them: on this machine, or on the emulated cluster.

``launch_local(spec)`` spawns one ``python -m layerplan.runtime.worker --spec spec.json`` per
rank (env:// rendezvous on 127.0.0.1 and a free port, one intra-op thread per rank by default),
keeps their PIDs, and returns rank 0's Measurement. ``launch_emulated(spec, name)`` does the same
with rank r inside host r of an emulated cluster (``runtime/emulate.py``): ``ip netns exec`` into
the host, rendezvous at host 0's address, gloo on the host's ``eth0``. Both go through one
launcher that only asks, per rank, for an argv prefix, environment and network namespace.

If any rank exits non-zero or dies from a signal (kill -9), the others are killed within seconds
and ``RunError`` names the rank, its exit signal or code, its last error line, and the last good
checkpoint. A hung rank makes its peers fail through the process group's timeout (``timeout_s``);
the launcher's own watchdog kills everything when no rank has finished a step for ``watchdog_s``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from layerplan.errors import ConfigError, LayerplanError

POLL_S = 0.05
GRACE_S = 0.5  # after a first failure: how long to wait for the other exits (to tell cause from effect)
TERM_S = 2.0  # SIGTERM, then SIGKILL after this


class RunError(LayerplanError):
    """A training run failed: a rank died, exited with an error, or the run stalled."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def preflight(spec):
    """Check spec × model before any process starts (ConfigError/ModelError, one line each)."""
    from layerplan.runtime import checkpoint, model
    from layerplan.runtime.layout import layout

    roles = layout(spec)
    net, _ = model.resolve(spec)
    model.check(spec, net)
    if spec.resume or spec.init_from:
        checkpoint.check_resume(spec, len(roles), roles)
    return roles, net


@dataclass(frozen=True)
class Placement:
    """Where and how one rank starts: what the launcher needs to know about a machine."""

    env: dict[str, str]
    """Rendezvous and network environment (MASTER_ADDR, GLOO_SOCKET_IFNAME, ...)."""
    argv_prefix: tuple[str, ...] = ()
    """Prepended to the worker's command line (start="exec"), e.g. ``ip netns exec HOST``."""
    netns: str | None = None
    """start="fork": the network namespace file the forked rank enters (``/run/netns/HOST``)."""


def launch_local(spec, *, run_dir: str | Path | None = None, watchdog_s: float | None = None,
                 on_spawn: Callable[[dict[int, int], Path], None] | None = None, quiet: bool = True,
                 start: str = "exec") -> dict:
    """Run ``spec`` on this machine; the Measurement dict (metrics.py) of rank 0.

    ``run_dir``: where the spec copy, rank logs and heartbeats go (default: a temporary directory,
    removed after a clean run, kept — and named in the RunError — after a failed one).
    ``watchdog_s``: stall limit — no rank finished a step for this long (default max(60, 3·timeout_s)).
    ``on_spawn(pids, run_dir)``: called once every rank is started (tests use it to inject faults).
    ``quiet``: False lets rank 0 draw its progress bar on this terminal's stderr.
    ``start``: "exec" (default) runs ``python -m layerplan.runtime.worker`` per rank; "fork" forks
    this process instead (no second torch import: ~0.1 s instead of seconds per rank; tests and
    benchmarks use it). Fork needs threads_per_rank = 1 — libgomp deadlocks in a forked child that
    starts a thread pool after the parent used one.
    """
    def place(rank: int, world: int, port: int) -> Placement:
        return Placement(env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"})

    return _launch(spec, place, run_dir=run_dir, watchdog_s=watchdog_s, on_spawn=on_spawn, quiet=quiet, start=start)


def launch_emulated(spec, name: str = "default", *, run_dir: str | Path | None = None,
                    watchdog_s: float | None = None, quiet: bool = False,
                    on_spawn: Callable[[dict[int, int], Path], None] | None = None, start: str = "exec") -> dict:
    """Run ``spec`` on the emulated cluster ``name`` (``layerplan cluster up``): rank r runs in host
    r (``ip netns exec``), rendezvous at host 0's address, gloo on each host's ``eth0`` (mandatory
    there: a host's hostname resolves to 127.0.0.1, EMULATION.md), ``threads_per_rank`` intra-op
    threads per rank (default 1). Returns rank 0's Measurement, with the same fault handling as
    ``launch_local`` (whose other arguments it shares; ``start="fork"`` enters the host's network
    namespace with setns(2) in the forked rank). Hosts beyond the world size stay idle.
    """
    from layerplan.runtime import emulate
    from layerplan.runtime.layout import world_size

    world = world_size(spec)
    emulate.check_available()
    try:
        emu = emulate.find(name)
    except emulate.EmulationError:
        raise emulate.EmulationError(
            f"no emulated cluster named {name!r} is up; create it first: layerplan cluster up --hosts {world} "
            f"--bandwidth 1Gbit --name {name}") from None
    if emu.hosts < world:
        raise ConfigError(f"run needs {world} hosts, cluster {name!r} has {emu.hosts}: "
                          f"layerplan cluster up --hosts {world} --name {name}")

    def place(rank: int, world: int, port: int) -> Placement:
        return Placement(env=emulate.host_env(emu, rank, world, master=0, port=port),
                         argv_prefix=tuple(emu.exec_prefix(rank)), netns=str(emu.netns_path(rank)))

    return _launch(spec, place, run_dir=run_dir, watchdog_s=watchdog_s, on_spawn=on_spawn, quiet=quiet, start=start)


class Session:
    """Ranks that stay up between runs: one start and rendezvous, then any number of runs whose
    layouts have the same world size (``layerplan tune``'s trials: every (g, µ, η) of Omnivore's
    groups runs on the same N + 2 ranks). Each run builds its model, data and roles afresh from
    its spec — so it starts from the spec's initialisation, exactly as a launched run would — and
    returns rank 0's Measurement; only the process start and the rendezvous are shared.

        with Session(first_spec) as s:
            m = s.run(spec)          # any number of times

    Runs go to the ranks as spec files in the run directory (``run-I.json``, written atomically;
    ``stop`` ends the session); a failed run raises RunError and ends the session. ``warmup``: one
    step of ``spec`` first, so that no run pays for opening the ranks' connections. Local ranks
    only (``start`` as for ``launch_local``).
    """

    def __init__(self, spec, *, run_dir: str | Path | None = None, watchdog_s: float | None = None,
                 start: str = "fork", warmup: bool = True):
        from layerplan.runtime.layout import world_size

        from layerplan.runtime.data import preload
        from layerplan.runtime.model import resolve

        self._world = world_size(spec)
        if start == "fork":  # what every run reads, once, before the ranks are forked: they inherit it
            preload(spec.data)
            resolve(spec)

        def place(rank: int, world: int, port: int) -> Placement:
            return Placement(env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"})

        st = _launch(spec.replace(progress=False), place, run_dir=run_dir, watchdog_s=watchdog_s, on_spawn=None,
                     quiet=True, start=start, session=True)
        self._procs, self._logs, self._roles = st["procs"], st["logs"], st["roles"]
        self.run_dir: Path = st["run_dir"]
        self._own_dir, self._watchdog_s = st["own_dir"], st["watchdog_s"]
        self._runs = 0
        self._closed = False
        ready = [self.run_dir / f"ready-rank{r}" for r in range(self._world)]
        try:  # every rank in the process group: a run's time is its own
            _watch(self._procs, self._roles, self.run_dir, spec, self._watchdog_s,
                   done=lambda: all(f.exists() for f in ready))
        except BaseException:
            self._end(clean=False)
            raise
        if warmup:  # connections open on first use (gloo pairs), kernels load: not any run's time
            self.run(spec.replace(steps=1, warmup_steps=0, checkpoint_dir=None, resume=False, init_from=None,
                                  params_out=None))

    def run(self, spec) -> dict:
        """Run ``spec`` on the session's ranks; rank 0's Measurement."""
        from layerplan.runtime.layout import world_size

        if self._closed:
            raise RunError("the session has ended")
        if world_size(spec) != self._world:
            raise ConfigError(f"a session of {self._world} ranks cannot run a layout of {world_size(spec)}")
        if spec.resume or spec.init_from:
            from layerplan.runtime import checkpoint
            from layerplan.runtime.layout import layout

            checkpoint.check_resume(spec, self._world, layout(spec))
        i = self._runs
        self._runs += 1
        out = self.run_dir / f"measurement-{i}.json"
        spec = spec.replace(metrics_out=str(out.resolve()), progress=False)
        tmp = self.run_dir / f"run-{i}.json.tmp"
        spec.save(tmp)
        os.replace(tmp, self.run_dir / f"run-{i}.json")
        try:
            _watch(self._procs, self._roles, self.run_dir, spec, self._watchdog_s, done=out.exists)
        except BaseException:
            self._end(clean=False)
            raise
        return json.loads(out.read_text())

    def close(self) -> None:
        """End the session: the ranks leave their process group and exit."""
        if not self._closed:
            (self.run_dir / "stop").write_text("")
            deadline = time.monotonic() + 30.0
            while time.monotonic() < deadline and any(p.poll() is None for p in self._procs.values()):
                time.sleep(POLL_S)
            self._end(clean=all(p.poll() == 0 for p in self._procs.values()))

    def _end(self, clean: bool) -> None:
        self._closed = True
        _kill(self._procs)
        for f in self._logs.values():
            f.close()
        if clean and self._own_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._end(clean=False)


def _launch(spec, place: Callable[[int, int, int], Placement], *, run_dir: str | Path | None, watchdog_s: float | None,
            on_spawn: Callable[[dict[int, int], Path], None] | None, quiet: bool, start: str,
            session: bool = False) -> dict:
    """The one launcher: ``place(rank, world, port)`` says where each rank runs. ``session``: the
    ranks wait for runs (``Session``) instead of running ``spec``; returns the started session's
    state instead of a Measurement."""
    from layerplan.runtime.run_spec import RunSpec

    if start not in ("exec", "fork"):
        raise ConfigError(f"start must be exec or fork, got {start!r}")
    if start == "fork" and (spec.threads_per_rank != 1 or not hasattr(os, "fork") or spec.backend != "gloo"):
        raise ConfigError("start='fork' needs threads_per_rank = 1, gloo, and a POSIX system; use start='exec'")
    from layerplan.runtime import checkpoint

    roles, _ = preflight(spec)
    checkpoint.check_outputs(spec)  # here, not in preflight: a torchrun spec's paths are other machines'
    world = len(roles)
    own_dir = not run_dir
    run_dir = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix="layerplan-run-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_out = spec.metrics_out or str(run_dir / "measurement.json")
    run_spec: RunSpec = spec.replace(metrics_out=str(Path(metrics_out).resolve()),
                                     progress=spec.progress and not quiet)
    spec_path = run_dir / "spec.json"
    run_spec.save(spec_path)
    for old in run_dir.glob("hb-rank*"):
        old.unlink()
    if Path(metrics_out).exists():
        Path(metrics_out).unlink()
    watchdog_s = watchdog_s if watchdog_s is not None else max(60.0, 3 * spec.timeout_s)
    port = free_port()
    procs: dict[int, subprocess.Popen] = {}
    logs = {}
    try:
        for r in range(world):
            where = place(r, world, port)
            env = dict(os.environ)
            env.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                       OMP_NUM_THREADS=str(spec.threads_per_rank), TORCH_CPP_LOG_LEVEL="ERROR",
                       LAYERPLAN_LAUNCHED="1", LAYERPLAN_RUN_DIR=str(run_dir))
            if session:
                env["LAYERPLAN_SESSION"] = "1"
            env.update(where.env)
            logs[r] = open(run_dir / f"rank{r}.log", "wb")
            show = r == 0 and run_spec.progress
            if start == "fork":
                procs[r] = _Forked(env, spec_path, logs[r], show, netns=where.netns)
                continue
            procs[r] = subprocess.Popen([*where.argv_prefix, sys.executable, "-m", "layerplan.runtime.worker",
                                         "--spec", str(spec_path)],
                                        env=env, stdin=subprocess.DEVNULL, stdout=logs[r],
                                        stderr=None if show else logs[r])
        if on_spawn is not None:
            on_spawn({r: p.pid for r, p in procs.items()}, run_dir)
        if session:
            return {"procs": procs, "logs": logs, "roles": roles, "run_dir": run_dir, "own_dir": own_dir,
                    "watchdog_s": watchdog_s}
        _watch(procs, roles, run_dir, spec, watchdog_s)
    except BaseException:
        session = False  # a session that failed to start is cleaned up here
        raise
    finally:
        if not session:
            _kill(procs)
            for f in logs.values():
                f.close()
    try:
        m = json.loads(Path(metrics_out).read_text())
    except (OSError, json.JSONDecodeError):
        raise RunError(f"every rank exited cleanly but rank 0 wrote no measurement to {metrics_out} "
                       f"(logs in {run_dir})") from None
    if own_dir:  # a failed run keeps its logs; a clean one leaves nothing behind
        shutil.rmtree(run_dir, ignore_errors=True)
    return m


def _watch(procs, roles, run_dir: Path, spec, watchdog_s: float, done: Callable[[], bool] | None = None) -> None:
    """Until every rank exited cleanly (or ``done()``); RunError on a failure or a stall."""
    last_progress = time.monotonic()
    seen: dict[int, str] = {}
    while True:
        codes = {r: p.poll() for r, p in procs.items()}
        if done is not None and done():
            return
        if all(c == 0 for c in codes.values()):
            if done is not None:
                raise RunError(f"every rank exited before the run finished (logs in {run_dir})")
            return
        failed = [r for r, c in codes.items() if c not in (None, 0)]
        if failed:
            time.sleep(GRACE_S)  # let the peers' reactions arrive, then tell cause from effect
            later = {r: p.poll() for r, p in procs.items()}
            signalled = [r for r in failed if codes[r] < 0] or [r for r, c in later.items() if c is not None and c < 0]
            culprit = signalled[0] if signalled else failed[0]
            hung = sorted(r for r, c in later.items() if c is None)
            hb = _heartbeats(run_dir, len(procs))
            _kill(procs)
            msg = _describe(culprit, procs[culprit].returncode, roles, run_dir, spec,
                            others=sorted(r for r, c in later.items() if c not in (None, 0) and r != culprit))
            if hung and not signalled:
                msg += "; still running when it failed (hung?): " + ", ".join(
                    f"rank {r} ({roles[r].kind}, {hb.get(r, '0')} steps done)" for r in hung)
            raise RunError(msg)
        hb = _heartbeats(run_dir, len(procs))
        if hb != seen:
            seen = hb
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > watchdog_s:
            _kill(procs)
            stalest = min(range(len(procs)), key=lambda r: int(hb.get(r, "-1") or -1))
            raise RunError(f"run stalled: no rank finished a step for {watchdog_s:.0f} s (rank {stalest} "
                           f"({roles[stalest].kind}) is furthest behind, at step {hb.get(stalest, 'start')}); "
                           f"killed all ranks; {_checkpoint_note(spec)}; logs in {run_dir}")
        time.sleep(POLL_S)


def _heartbeats(run_dir: Path, world: int) -> dict[int, str]:
    out = {}
    for r in range(world):
        try:
            out[r] = (run_dir / f"hb-rank{r}").read_text()
        except OSError:
            pass
    return out


def _describe(rank: int, code: int, roles, run_dir: Path, spec, others: list[int]) -> str:
    if code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    last = _last_error_line(run_dir / f"rank{rank}.log")
    msg = f"rank {rank} ({roles[rank].kind}) {how}"
    if last:
        msg += f" ({last})"
    if others:
        msg += f"; rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} failed after it"
    return f"{msg}; killed the other ranks; {_checkpoint_note(spec)}; logs in {run_dir}"


def _checkpoint_note(spec) -> str:
    from layerplan.runtime.checkpoint import latest

    info = latest(spec.checkpoint_dir)
    if info is None:
        return "no checkpoint" if spec.checkpoint_dir is None else f"no checkpoint in {spec.checkpoint_dir}"
    return f"last good checkpoint: step {info['step']} in {spec.checkpoint_dir} (resume with --resume)"


def _last_error_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln:
            return ln[:300]
    return lines[-1][:300] if lines else ""


def _kill(procs: dict[int, subprocess.Popen]) -> None:
    alive = [p for p in procs.values() if p.poll() is None]
    for p in alive:
        try:
            p.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + TERM_S
    for p in alive:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class _Forked:
    """A rank forked from this process, with the small part of Popen's interface the launcher uses."""

    def __init__(self, env: dict, spec_path: Path, log, show: bool, netns: str | None = None):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # child: never returns
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.environ.clear()
                os.environ.update(env)
                os.dup2(log.fileno(), 1)
                if not show:
                    os.dup2(log.fileno(), 2)
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", closefd=False)
                if netns is not None:  # before any socket: the rank's whole network is the host's
                    _enter_netns(netns)
                from layerplan.runtime.worker import main

                code = main(["--spec", str(spec_path)])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:  # noqa: BLE001 — report and exit like an uncaught exception would
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


CLONE_NEWNET = 0x40000000  # <linux/sched.h>


def _enter_netns(path: str) -> None:
    """setns(2) into the network namespace at ``path`` (what ``ip netns exec`` does first; Python
    3.12 has os.setns, 3.10/3.11 need libc). Only for a freshly forked, single-threaded child."""
    import ctypes

    fd = os.open(path, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)
