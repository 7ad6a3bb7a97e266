"""Keep ``torch._dynamo`` (≈1.2 s of imports on this machine's CPUs) out of zoo-model analysis.

Analysis never compiles anything, yet torch and torchvision import the compiler on first use:

- ``torchvision.ops.roi_align`` does ``from torch._dynamo.utils import is_compile_supported`` at
  import time, and ``import torchvision.models`` imports it (convnext → ops.misc → ops);
- functions wrapped by ``torch._disable_dynamo`` — every ``TorchDispatchMode.__torch_dispatch__``
  (``FlopCounterMode``'s included), the ``torch._refs`` initialisers a model built on the meta
  device calls — import ``torch._dynamo`` on their first call only to mark themselves "do not
  compile" (``torch._dynamo.disable(fn)``, cached in ``fn.__dynamo_disable``).

Inside ``without_dynamo()`` a stand-in answers both: ``disable(fn)`` returns ``fn`` (nothing is
compiled inside the block, so there is nothing to disable) and ``utils.is_compile_supported``
imports the real one when called. On exit the stand-in leaves ``sys.modules`` and every mark it
caused is removed, so later code — a ``torch.compile`` in the same process — gets the real
package and the real marks. Used only around zoo models (layerplan's own code); a user's factory
may use the compiler itself and is analysed without it. Does nothing when ``torch._dynamo`` is
already imported.
"""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager
from typing import Any, Callable, Iterator

_MARK = "__dynamo_disable"  # where torch._compile._disable_dynamo caches torch._dynamo.disable(fn)


@contextmanager
def without_dynamo() -> Iterator[None]:
    if "torch._dynamo" in sys.modules:
        yield
        return
    import torch

    marked: list[Callable[..., Any]] = []

    def disable(fn=None, recursive=True, **_kwargs):
        if fn is None:
            return lambda f: disable(f, recursive)
        marked.append(fn)
        return fn

    def is_compile_supported(device_type):
        from torch._dynamo.utils import is_compile_supported as real

        return real(device_type)

    pkg = types.ModuleType("torch._dynamo")
    pkg.__path__ = []  # a package, so torch._dynamo.utils can be found below it
    pkg.disable = disable
    utils = types.ModuleType("torch._dynamo.utils")
    utils.is_compile_supported = is_compile_supported
    pkg.utils = utils
    stand_ins = {"torch._dynamo": pkg, "torch._dynamo.utils": utils}
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name, mod in stand_ins.items():
            if sys.modules.get(name) is mod:
                del sys.modules[name]
        if torch.__dict__.get("_dynamo") is pkg:
            del torch._dynamo
        for fn in marked:
            if getattr(fn, _MARK, None) is fn:
                delattr(fn, _MARK)


@contextmanager
def skip_init() -> Iterator[None]:
    """``torch.nn.init``'s in-place initialisers do nothing inside the block.

    For modules built on the meta device: their tensors have no values to initialise, yet each
    initialiser runs a ``torch._refs`` decomposition whose dtype checks import sympy (≈0.8 s) and
    cost ≈1 s on ResNet-152's 155 convolutions. Models read ``nn.init.<name>`` when they call it
    (``torch.nn.Linear.reset_parameters`` included), so replacing the module's attributes for the
    block reaches them; the originals are restored on exit.
    """
    import torch.nn.init as init

    saved = {name: getattr(init, name) for name in dir(init)
             if name.endswith("_") and not name.startswith("_") and callable(getattr(init, name))}

    def unchanged(tensor, *_args, **_kwargs):
        return tensor

    for name in saved:
        setattr(init, name, unchanged)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(init, name, fn)
