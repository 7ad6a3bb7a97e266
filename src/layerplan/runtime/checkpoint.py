"""Checkpoints: every rank's state after step s, written atomically, and exact resume.

Layout under ``checkpoint_dir``::

    step-00000006/ckpt-rank0.pt ... ckpt-rank{W-1}.pt   one file per rank
    latest.json                                          written last, by rank 0, after a barrier

A rank file holds the steps done, the role's state (its model part, optimizer momentum buffers —
or a PS server's shard and buffer), the data position (``Sharder.position``) and torch's RNG
state. Every file is written to a temporary file in the same directory, fsync'ed and
``os.replace``d. ``latest.json`` names the newest complete checkpoint; only after it is replaced
are older step directories removed, so a crash at any moment leaves a complete checkpoint behind.
Resuming loads every rank's file and continues at the next step: the data stream is a function of
the step (``data.py``), so the parameters after resume equal those of an uninterrupted run.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from layerplan.errors import ConfigError

# RunSpec fields that must match between the checkpointed run and the resumed one.
COMPATIBLE = ("model", "strategy", "config", "input_size", "num_classes", "batch_size", "data", "seed",
              "deterministic", "dtype")


def check_outputs(spec) -> None:
    """Where the run writes — its checkpoint and parameters directories (created here), its
    metrics file — can be written, checked before any rank starts: a run that trained for an hour
    and then cannot write its checkpoint or its measurement loses both."""
    from layerplan.outputs import writable_dir, writable_file

    if spec.checkpoint_dir:
        writable_dir(spec.checkpoint_dir, "checkpoint directory")
    if spec.params_out:
        writable_dir(spec.params_out, "parameters directory")
    if spec.metrics_out:
        writable_file(spec.metrics_out, "metrics file")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1) + "\n").encode())


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def latest(checkpoint_dir: str | Path | None) -> dict | None:
    """The content of latest.json (None when there is no checkpoint)."""
    if not checkpoint_dir:
        return None
    p = Path(checkpoint_dir) / "latest.json"
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def due(spec, steps_done: int) -> bool:
    if not spec.checkpoint_dir:
        return False
    if steps_done == spec.steps:
        return True
    return bool(spec.checkpoint_every) and steps_done % spec.checkpoint_every == 0


def save(spec, rank: int, world: int, steps_done: int, role, sharder, barrier) -> None:
    """Every rank calls this after step ``steps_done − 1``."""
    import torch

    root = Path(spec.checkpoint_dir)
    d = root / step_dir_name(steps_done)
    d.mkdir(parents=True, exist_ok=True)
    role.checkpoint_comm(steps_done - 1)
    state = {"step": steps_done, "rank": rank, "kind": role.ctx.role.kind, "role": role.state_dict(),
             "data": sharder.position(steps_done), "rng": torch.get_rng_state()}
    atomic_torch_save(state, d / f"ckpt-rank{rank}.pt")
    barrier()
    if rank == 0:
        kinds = [r.kind for _, r in sorted(role.ctx.roles.items())]
        atomic_write_json(root / "latest.json", {"step": steps_done, "dir": d.name, "world_size": world,
                                                 "kinds": kinds, "time": time.time(), "spec": spec.to_dict()})
        for old in root.glob("step-*"):
            if old.is_dir() and old.name != d.name:
                shutil.rmtree(old, ignore_errors=True)


def source(spec) -> str:
    """The directory a run starts from: init_from, else (resume) its own checkpoint_dir."""
    return spec.init_from or spec.checkpoint_dir


def check_resume(spec, world: int, roles: dict | None = None) -> dict:
    """latest.json of a checkpoint this spec can continue (ConfigError otherwise). ``init_from`` may
    change the strategy config (e.g. the groups) as long as every rank keeps its role."""
    src = source(spec)
    info = latest(src)
    if info is None:
        raise ConfigError(f"nothing to {'start from' if spec.init_from else 'resume'}: no {Path(src) / 'latest.json'}")
    old = info.get("spec", {})
    fields = [k for k in COMPATIBLE if not (spec.init_from and k == "config")]
    diff = [k for k in fields if old.get(k) != spec.to_dict()[k]]
    if diff:
        now = spec.to_dict()
        raise ConfigError(f"cannot {'start from' if spec.init_from else 'resume'} {src}: the checkpoint was "
                          f"written with a different {', '.join(diff)} ("
                          + "; ".join(f"{k} {old.get(k)!r} there, {now[k]!r} here" for k in diff) + ")")
    if info.get("world_size") != world:
        raise ConfigError(f"cannot resume: the checkpoint has {info.get('world_size')} ranks, this run {world}")
    if roles is not None and info.get("kinds") is not None:
        kinds = [r.kind for _, r in sorted(roles.items())]
        if info["kinds"] != kinds:
            raise ConfigError(f"cannot start from {src}: its ranks hold other roles ({', '.join(info['kinds'])}) "
                              f"than this run's ({', '.join(kinds)})")
    if info["step"] >= spec.steps:
        raise ConfigError(f"the checkpoint is at step {info['step']}; --steps {spec.steps} leaves nothing to do")
    return info


def load(spec, rank: int, world: int, role) -> int:
    """Restore this rank from the latest checkpoint; returns the steps done."""
    import torch

    info = check_resume(spec, world, role.ctx.roles)
    path = Path(source(spec)) / info["dir"] / f"ckpt-rank{rank}.pt"
    state = torch.load(path, map_location=role.ctx.device, weights_only=False)
    if state["step"] != info["step"] or state["rank"] != rank:
        raise ConfigError(f"{path}: holds step {state['step']} of rank {state['rank']}, expected step "
                          f"{info['step']} of rank {rank}")
    role.load_state_dict(state["role"])
    role.resume_at(int(state["step"]))
    torch.set_rng_state(state["rng"].cpu())
    return int(state["step"])
