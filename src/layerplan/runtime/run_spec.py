"""RunSpec: everything one distributed training run needs, as a frozen, strictly parsed spec.

The launcher writes it as JSON; every rank reads the same file (``worker --spec spec.json``), so a
run started by ``layerplan train``, by ``launch_local`` or by ``torchrun`` behaves identically.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from layerplan.errors import ConfigError, SpecError

STRATEGIES = ("ps", "allreduce", "stanza", "ralp", "hybrid", "groups")
BACKENDS = ("gloo", "nccl")
DTYPES = ("float32", "float64")
DATA = ("synthetic", "digits", "digits-augmented")
RALP_SETTINGS = ("N", "H")
FORMAT_VERSION = 1

# Per strategy: config key -> default (REQUIRED = must be given).
REQUIRED = object()
CONFIG_KEYS: dict[str, dict[str, Any]] = {
    "ps": {"workers": REQUIRED, "servers": 1},
    "allreduce": {"workers": REQUIRED},
    "stanza": {"conv_workers": REQUIRED, "fc_workers": 1, "split": None, "overlap": True},
    "ralp": {"workers": REQUIRED, "split": None, "ralp_setting": "N"},
    "hybrid": {"conv_workers": REQUIRED, "fc_workers": 1, "replicate": [], "split": None},
    "groups": {"machines": REQUIRED, "groups": REQUIRED, "split": None, "pipelined": False},
}


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSpec:
    """One training run: model, strategy and its configuration, optimisation, data, bookkeeping."""

    model: str
    """MODEL as on the CLI: a zoo name, file.py:factory, package.module:factory."""
    strategy: str
    """One of ps, allreduce, stanza, ralp, hybrid, groups."""
    config: dict = field(default_factory=dict)
    """Strategy configuration. ps: workers, servers. allreduce: workers. stanza: conv_workers,
    fc_workers, split (layer name; null = the NetSpec's phase boundary), overlap (true: the conv
    all-reduce during the backward pass, DDP's buckets; false: after it, as the paper). ralp: workers (worker
    ranks; one more rank is the PS worker), split (null = the RALP profile's split), ralp_setting
    ("N": the N-node cluster is workers + PS, n_w = N − 1; "H": n_w = N/2 — only the node count
    the run stands for changes, see layout.nodes_represented). hybrid: conv_workers, fc_workers
    (FC machines), replicate (fc layer names computed replicated over the FC machines instead of
    partitioned by output features), split (as stanza's). groups: machines (N conv machines),
    groups (g, divides N), split (null = the phase boundary), pipelined (false; not run yet)."""
    input_size: int | None = None
    """Input height = width (None: the model's default)."""
    num_classes: int | None = None
    """Output classes (None: the model's default)."""
    batch_size: int = 32
    """Samples per data worker per step (K); the global batch is K × data workers."""
    steps: int = 10
    """Run until this many steps are done in total (a resumed run continues up to it). groups: every
    compute group does this many iterations (one step = one round, each group one iteration on k·B
    samples, N·B samples in all), so the conv model server applies groups × steps updates."""
    lr: float = 0.01
    """SGD learning rate."""
    momentum: float = 0.9
    """SGD momentum (torch.optim.SGD semantics; no dampening, no Nesterov)."""
    weight_decay: float = 0.0
    """SGD weight decay."""
    data: str = "synthetic"
    """synthetic | digits | digits-augmented | imagefolder:PATH."""
    seed: int = 0
    """Seeds the model initialisation (same on every rank) and the data order."""
    threads_per_rank: int = 1
    """torch intra-op threads per rank (OMP_NUM_THREADS)."""
    checkpoint_dir: str | None = None
    """Where checkpoints go (None: no checkpoints)."""
    checkpoint_every: int = 0
    """Checkpoint after every this many steps (0: only after the last step); needs checkpoint_dir."""
    resume: bool = False
    """Continue from checkpoint_dir/latest.json."""
    init_from: str | None = None
    """Start from the latest checkpoint in this directory — its model, momentum buffers and steps
    done — though it was written with other hyperparameters: this run's lr, momentum, weight decay
    and strategy config (e.g. groups) apply; model, data, seed, dtype and each rank's role must
    match. Omnivore's optimizer continues every trial from the current model this way."""
    metrics_out: str | None = None
    """Write the Measurement JSON here (rank 0)."""
    params_out: str | None = None
    """Directory: every rank saves the parameters it holds (params-rank{r}.pt) at the end (tests)."""
    timeout_s: float = 20.0
    """torch.distributed timeout: a peer that does not answer within it fails the run."""
    deterministic: bool = False
    """Set every dropout's p to 0, so the run equals the single-process reference exactly."""
    backend: str = "gloo"
    """gloo (CPU) or nccl (CUDA; one GPU per rank, LOCAL_RANK)."""
    dtype: str = "float32"
    """Parameters, activations and messages: float32, or float64 (exactness checks of networks whose
    BatchNorm on tiny per-worker batches amplifies float32 rounding, see tests)."""
    warmup_steps: int | None = None
    """Steps left out of the step time; None: 1, or 2 for ``groups`` (a server's first step starts
    mid-round, so the second step still carries the start: 1.05 s against 0.53 s steady on
    resnet_cifar, 2 groups)."""
    progress: bool = True
    """Rank 0 shows a progress bar."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise SpecError(f"RunSpec: model must be a non-empty string, got {self.model!r}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r}: expected one of {', '.join(STRATEGIES)}")
        object.__setattr__(self, "config", normalize_config(self.strategy, self.config))
        for f in ("batch_size", "steps", "threads_per_rank"):
            _positive_int(getattr(self, f), f)
        for f in ("input_size", "num_classes"):
            if getattr(self, f) is not None:
                _positive_int(getattr(self, f), f)
        if self.warmup_steps is None:
            object.__setattr__(self, "warmup_steps", 2 if self.strategy == "groups" else 1)
        for f in ("checkpoint_every", "warmup_steps"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise SpecError(f"RunSpec: {f} must be a non-negative integer, got {v!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise SpecError(f"RunSpec: seed must be a non-negative integer, got {self.seed!r}")
        if not _finite(self.lr) or self.lr <= 0:
            raise SpecError(f"RunSpec: lr must be a positive number, got {self.lr!r}")
        if not _finite(self.momentum) or not 0 <= self.momentum < 1:
            raise SpecError(f"RunSpec: momentum must be in [0, 1), got {self.momentum!r}")
        if not _finite(self.weight_decay) or self.weight_decay < 0:
            raise SpecError(f"RunSpec: weight_decay must be >= 0, got {self.weight_decay!r}")
        if not _finite(self.timeout_s) or self.timeout_s <= 0:
            raise SpecError(f"RunSpec: timeout_s must be a positive number of seconds, got {self.timeout_s!r}")
        if not isinstance(self.data, str) or not (
            self.data in DATA or (self.data.startswith("imagefolder:") and len(self.data) > 12)
        ):
            raise SpecError(f"RunSpec: data must be {', '.join(DATA)} or imagefolder:PATH, got {self.data!r}")
        if self.backend not in BACKENDS:
            raise SpecError(f"RunSpec: backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.dtype not in DTYPES:
            raise SpecError(f"RunSpec: dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.resume and not self.checkpoint_dir:
            raise SpecError("RunSpec: resume needs checkpoint_dir (where the checkpoints are)")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise SpecError("RunSpec: checkpoint_every needs checkpoint_dir")
        if self.resume and self.init_from:
            raise SpecError("RunSpec: resume continues checkpoint_dir; init_from starts from another run's "
                            "checkpoint — set one of them")
        if self.strategy == "groups" and self.checkpoint_every:
            raise ConfigError("groups: checkpoints only after the last step (checkpoint_every 0): mid-run, the "
                              "asynchronous groups stand at different iterations and there is no consistent cut")
        for f in ("deterministic", "resume", "progress"):
            if not isinstance(getattr(self, f), bool):
                raise SpecError(f"RunSpec: {f} must be true or false, got {getattr(self, f)!r}")
        for f in ("checkpoint_dir", "init_from", "metrics_out", "params_out"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, str) or not v):
                raise SpecError(f"RunSpec: {f} must be a path or null, got {v!r}")

    # ---- derived -------------------------------------------------------------------------
    @property
    def split(self) -> str | None:
        return self.config.get("split")

    # ---- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["config"] = dict(self.config)
        return {"format": FORMAT_VERSION, **d}

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    def replace(self, **changes: Any) -> "RunSpec":
        d = self.to_dict()
        d.pop("format")
        d.update(changes)
        return RunSpec(**d)

    @classmethod
    def from_dict(cls, data: Any, where: str = "RunSpec") -> "RunSpec":
        """Strict: every field must be present (as ``to_dict`` writes it) and nothing else."""
        if not isinstance(data, dict):
            raise SpecError(f"{where}: expected a JSON object, got {type(data).__name__}")
        keys = {"format"} | {f.name for f in fields(cls)}
        unknown, missing = sorted(set(data) - keys), sorted(keys - set(data))
        if unknown:
            raise SpecError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}")
        if missing:
            raise SpecError(f"{where}: missing key(s) {', '.join(map(repr, missing))}")
        if data["format"] != FORMAT_VERSION:
            raise SpecError(f"{where}: format {data['format']!r} is not supported (expected {FORMAT_VERSION})")
        kw = {k: v for k, v in data.items() if k != "format"}
        if not isinstance(kw["config"], dict):
            raise SpecError(f"{where}: config must be an object")
        for f in ("lr", "momentum", "weight_decay", "timeout_s"):
            if isinstance(kw[f], int) and not isinstance(kw[f], bool):
                kw[f] = float(kw[f])
            elif not isinstance(kw[f], float):
                raise SpecError(f"{where}: {f} must be a number, got {kw[f]!r}")
        try:
            return cls(**kw)
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None

    @classmethod
    def from_json(cls, text: str, where: str = "RunSpec") -> "RunSpec":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError(f"{where}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
        return cls.from_dict(data, where)

    @classmethod
    def load(cls, path: str | Path) -> "RunSpec":
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise SpecError(f"cannot read run spec {str(p)!r}: {e.strerror}") from None
        return cls.from_json(text, where=str(p))


def normalize_config(strategy: str, config: Any) -> dict[str, Any]:
    """The strategy's config with defaults filled in; unknown keys and bad values are errors."""
    if not isinstance(config, dict):
        raise ConfigError(f"RunSpec: config must be a dict, got {type(config).__name__}")
    allowed = CONFIG_KEYS[strategy]
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ConfigError(f"{strategy}: unknown config key(s) {', '.join(map(repr, unknown))} "
                        f"(expected {', '.join(allowed)})")
    out: dict[str, Any] = {}
    for key, default in allowed.items():
        if key in config and config[key] is not None:
            out[key] = config[key]
        elif default is REQUIRED:
            raise ConfigError(f"{strategy}: config needs {key!r}")
        else:
            out[key] = default
    for key in ("workers", "servers", "conv_workers", "fc_workers", "machines", "groups"):
        if key in out:
            v = out[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{strategy}: {key} must be at least 1, got {v!r}")
    if out.get("split") is not None and (not isinstance(out["split"], str) or not out["split"]):
        raise ConfigError(f"{strategy}: split must be a layer name or null, got {out['split']!r}")
    if "replicate" in out:
        r = out["replicate"]
        if isinstance(r, str) or not isinstance(r, (list, tuple)) or not all(isinstance(x, str) and x for x in r):
            raise ConfigError(f"{strategy}: replicate must be a list of fc layer names, got {r!r}")
        if len(set(r)) != len(r):
            raise ConfigError(f"{strategy}: replicate names a layer twice: {', '.join(r)}")
        out["replicate"] = list(r)
    if "overlap" in out and not isinstance(out["overlap"], bool):
        raise ConfigError(f"{strategy}: overlap must be true or false, got {out['overlap']!r}")
    if strategy == "groups":
        if out["machines"] % out["groups"]:
            raise ConfigError(f"groups: {out['groups']} groups do not divide {out['machines']} conv machines evenly "
                              "(groups must divide machines)")
        if not isinstance(out["pipelined"], bool):
            raise ConfigError(f"groups: pipelined must be true or false, got {out['pipelined']!r}")
        if out["pipelined"]:
            raise ConfigError("groups: pipelined runs (two batches in flight per group) are not implemented in the "
                              "runtime; set pipelined false (the cost engine still predicts them)")
    if "ralp_setting" in out and out["ralp_setting"] not in RALP_SETTINGS:
        raise ConfigError(f"ralp: ralp_setting must be N or H, got {out['ralp_setting']!r}")
    return out


def _positive_int(v: Any, name: str) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise SpecError(f"RunSpec: {name} must be a positive integer, got {v!r}")


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
