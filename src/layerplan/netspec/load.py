"""MODEL as a person writes it → (NetSpec, a factory that rebuilds the real module).

MODEL is one of:

- a zoo name (``alexnet``, ``vgg16_cifar`` ...; ``layerplan zoo`` lists them);
- ``path/to/file.py:factory`` or ``package.module:factory``: ``factory`` is a callable returning an
  ``nn.Module``. It may take no arguments; if it has a ``num_classes`` (or ``input_size``)
  parameter, ``--num-classes`` (``--input-size``) is passed to it. The input shape is
  ``(C, S, S)`` with ``S = --input-size`` and ``C`` from an ``input_shape`` attribute of the module
  or the factory (3 without one); without ``--input-size`` the ``input_shape`` attribute is used
  as it is, and without either the model is an error that asks for ``--input-size``;
- a saved NetSpec (``*.json``), loaded strictly; it has no code, so the factory is ``None``.

For the analysis the module is built under ``torch.device("meta")`` (no memory, no init time);
a factory that cannot run there is built on the CPU and copied. The factory returned to the
runtime builds the module normally on the CPU with random weights.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Callable

from layerplan.errors import LayerplanError, ModelError, SpecError
from layerplan.netspec.lean_import import skip_init, without_dynamo
from layerplan.netspec.spec import NetSpec

ModuleFactory = Callable[[], Any]
"""A zero-argument callable that returns a freshly initialised ``torch.nn.Module``."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _check_override(what: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ModelError(f"{what} must be a positive integer, got {value!r}")


def resolve_model(spec: str, *, input_size: int | None = None, num_classes: int | None = None,
                  batch_check: bool = True) -> tuple[NetSpec, ModuleFactory | None]:
    """(NetSpec, factory of the real module or None for a saved NetSpec) for MODEL ``spec``;
    analyses are cached per (spec, input_size, num_classes, batch_check) in this process."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelError(f"MODEL must be a zoo name, file.py:factory, package.module:factory or a NetSpec .json; "
                         f"got {spec!r}")
    _check_override("--input-size", input_size)
    _check_override("--num-classes", num_classes)
    return _resolve_cached(spec.strip(), input_size, num_classes, batch_check)


@functools.lru_cache(maxsize=64)
def _resolve_cached(spec: str, input_size: int | None, num_classes: int | None,
                    batch_check: bool) -> tuple[NetSpec, ModuleFactory | None]:
    if spec.endswith(".json"):
        return _load_json(spec, input_size, num_classes), None
    key = _disk_key(spec, input_size, num_classes, batch_check)
    cached = _disk_load(key)
    if cached is not None:
        return cached, functools.partial(_build_lazily, spec, input_size, num_classes)
    net, factory = _analyse(spec, input_size, num_classes, batch_check)
    if key is not None:
        _disk_save(key, net)
    return net, factory


# ---- the on-disk cache of zoo analyses ---------------------------------------------------------
# A zoo network is layerplan's own code: its NetSpec depends only on the name, the overrides, the
# torch/torchvision versions and layerplan's analysis code. Caching it lets repeat commands skip
# importing torch altogether. LAYERPLAN_CACHE_DIR moves it; LAYERPLAN_NO_CACHE=1 turns it off.
_ANALYSIS_SOURCES = ("analyze.py", "zoo.py", "spec.py", "load.py")


def cache_dir() -> Path | None:
    import os

    if os.environ.get("LAYERPLAN_NO_CACHE"):
        return None
    if os.environ.get("LAYERPLAN_CACHE_DIR"):
        return Path(os.environ["LAYERPLAN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "layerplan" / "netspec"


def _disk_key(spec: str, input_size: int | None, num_classes: int | None, batch_check: bool) -> str | None:
    """A key for zoo names only (file and module factories are the user's code: never cached)."""
    import hashlib
    from importlib import metadata

    if ":" in spec or "/" in spec or spec.endswith(".py") or cache_dir() is None:
        return None
    h = hashlib.sha256()
    try:
        versions = [metadata.version(d) for d in ("torch", "torchvision")]
    except metadata.PackageNotFoundError:
        return None
    here = Path(__file__).parent
    for name in _ANALYSIS_SOURCES:
        h.update((here / name).read_bytes())
    h.update(repr((spec, input_size, num_classes, batch_check, versions)).encode())
    return f"{spec}-{h.hexdigest()[:20]}"


def _disk_load(key: str | None) -> NetSpec | None:
    if key is None:
        return None
    path = cache_dir() / f"{key}.json"
    try:
        return NetSpec.from_json(path.read_text(), where=str(path))
    except (OSError, LayerplanError):  # absent, unreadable or stale: analyse again
        return None


def _disk_save(key: str, net: NetSpec) -> None:
    import os
    import tempfile

    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(net.to_json())
        os.replace(tmp, d / f"{key}.json")
    except OSError:
        pass  # a read-only home only costs speed


def _build_lazily(spec: str, input_size: int | None, num_classes: int | None) -> Any:
    factory, _, _, _ = _module_source(spec, input_size, num_classes)
    return _build(factory, spec, meta=False)


def _analyse(spec: str, input_size: int | None, num_classes: int | None,
             batch_check: bool) -> tuple[NetSpec, ModuleFactory]:
    from layerplan.netspec.analyze import analyze

    factory, input_shape, source, target = _module_source(spec, input_size, num_classes)
    with without_dynamo() if target is None else contextlib.nullcontext():  # zoo models: lean_import
        meta_module = _build(factory, spec, meta=True)
        if input_shape is None:
            input_shape = _factory_input_shape(meta_module, target, spec, input_size)
        net = analyze(meta_module, input_shape, name=spec, source=source, num_classes=num_classes,
                      batch_check=batch_check)
    return net, functools.partial(_build, factory, spec, meta=False)


def build_module(spec: str, *, input_size: int | None = None, num_classes: int | None = None) -> Any:
    """A freshly initialised ``nn.Module`` (CPU, random weights) for MODEL ``spec``."""
    _, factory = resolve_model(spec, input_size=input_size, num_classes=num_classes)
    if factory is None:
        raise ModelError(f"{spec!r} is a saved NetSpec: it describes a network but has no code to build one; "
                         "use a zoo name, file.py:factory or package.module:factory")
    return factory()


# ---- the three kinds of MODEL -----------------------------------------------------------------
def _load_json(spec: str, input_size: int | None, num_classes: int | None) -> NetSpec:
    if not Path(spec).is_file():
        raise SpecError(f"NetSpec file {spec!r} not found")
    net = NetSpec.load(spec)
    if input_size is not None and net.input_shape[-1] != input_size:
        raise ModelError(f"{spec} is a saved NetSpec for input shape {net.input_shape}: --input-size {input_size} "
                         "cannot change it (analyse the model again with that size)")
    if num_classes is not None and net.num_classes != num_classes:
        raise ModelError(f"{spec} is a saved NetSpec with {net.num_classes} classes: --num-classes {num_classes} "
                         "cannot change it (analyse the model again)")
    return net


def _module_source(spec: str, input_size: int | None, num_classes: int | None
                   ) -> tuple[Callable[[], Any], tuple[int, ...] | None, str, Any]:
    """(zero-argument factory, input shape (None: ask the module), source, the user's callable)."""
    if ":" not in spec:
        from layerplan.netspec import zoo

        if spec.endswith(".py"):
            raise ModelError(f"{spec}: name the factory in the file, e.g. {spec}:make_model")
        if spec not in zoo.ZOO:
            close = difflib.get_close_matches(spec, list(zoo.ZOO), n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ModelError(f"unknown model {spec!r}{hint}; MODEL is a zoo name (see `layerplan zoo`), "
                             "file.py:factory, package.module:factory or a NetSpec .json")
        entry = zoo.ZOO[spec]

        def zoo_factory() -> Any:
            return zoo.build(spec, num_classes=num_classes, input_size=input_size)[0]

        return zoo_factory, entry.input_shape(input_size), entry.source, None
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise ModelError(f"{spec!r}: expected file.py:factory or package.module:factory")
    if where.endswith(".py") or "/" in where or "\\" in where:
        module = _import_file(where)
    else:
        module = _import_module(where)
    target = module
    for part in attr.split("."):
        if not hasattr(target, part):
            names = [n for n in dir(module) if not n.startswith("_")]
            close = difflib.get_close_matches(attr, names, n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ModelError(f"{where} has no attribute {attr!r}{hint}")
        target = getattr(target, part)
    if not callable(target):
        raise ModelError(f"{spec}: {attr} is a {type(target).__name__}, not a callable that returns an nn.Module")
    return _with_overrides(target, spec, input_size, num_classes), None, f"{where}:{attr}", target


def _import_file(path: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"model file {path!r} not found")
    name = f"layerplan_model_{abs(hash(str(p.resolve())))}"
    try:
        mod_spec = importlib.util.spec_from_file_location(name, p)
        if mod_spec is None or mod_spec.loader is None:
            raise ModelError(f"cannot import {path!r} as a Python file")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        mod_spec.loader.exec_module(module)
    except LayerplanError:
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001 — user code may raise anything
        sys.modules.pop(name, None)
        raise ModelError(f"importing {path} failed: {_first_line(e)}") from None
    return module


def _import_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        raise ModelError(f"cannot import module {name!r}: {_first_line(e)} (is it installed or on PYTHONPATH?)") from None
    except (Exception, SystemExit) as e:  # noqa: BLE001 — user code may raise anything
        raise ModelError(f"importing module {name!r} failed: {_first_line(e)}") from None


def _with_overrides(target: Callable[..., Any], spec: str, input_size: int | None,
                    num_classes: int | None) -> Callable[[], Any]:
    """A zero-argument factory passing --num-classes / --input-size to parameters of those names."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        params = {}
    kwargs: dict[str, int] = {}
    if num_classes is not None:
        if "num_classes" not in params:
            raise ModelError(f"{spec}: --num-classes needs a factory with a num_classes parameter")
        kwargs["num_classes"] = num_classes
    if input_size is not None and "input_size" in params:
        kwargs["input_size"] = input_size
    return functools.partial(target, **kwargs)


def _factory_input_shape(module: Any, target: Any, spec: str, input_size: int | None) -> tuple[int, ...]:
    """(C, S, S) from --input-size (C from an input_shape attribute, else 3), else the module's or
    the factory's input_shape attribute, else a ModelError asking for --input-size."""
    shape = None
    for owner in (module, target):
        shape = getattr(owner, "input_shape", None)
        if shape is not None:
            break
    if shape is not None and (not isinstance(shape, (tuple, list)) or not shape
                              or any(not isinstance(d, int) or isinstance(d, bool) or d <= 0 for d in shape)):
        raise ModelError(f"{spec}: input_shape must be a tuple of positive integers such as (3, 32, 32), "
                         f"got {shape!r}")
    if input_size is not None:
        channels = shape[0] if shape is not None and len(shape) >= 2 else 3
        return (channels, input_size, input_size)
    if shape is None:
        raise ModelError(f"{spec}: cannot tell the input shape; pass --input-size (3 channels) or give the module "
                         "or the factory an input_shape attribute such as (3, 32, 32)")
    return tuple(shape)


# ---- building -----------------------------------------------------------------------------------
def _build(factory: Callable[[], Any], spec: str, *, meta: bool) -> Any:
    """Call the factory (under the meta device for analysis, falling back to the CPU) and check
    that it returned an nn.Module."""
    import torch
    import torch.nn as nn

    module: Any = None
    if meta:
        try:
            with torch.device("meta"), skip_init():  # meta tensors hold no values to initialise
                module = factory()
        except LayerplanError:
            raise
        except Exception:  # noqa: BLE001 — retried on the CPU below, where its error is reported
            module = None
    if module is None:
        try:
            module = factory()
        except LayerplanError:
            raise
        except (Exception, SystemExit) as e:  # noqa: BLE001 — user code may raise anything
            raise ModelError(f"{spec}: the factory raised {_first_line(e)}") from None
    if not isinstance(module, nn.Module):
        raise ModelError(f"{spec}: the factory returned {type(module).__name__}, not a torch.nn.Module")
    return module


__all__ = ["ModuleFactory", "build_module", "resolve_model"]
