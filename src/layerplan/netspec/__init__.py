"""Network specs: the pure data types (``spec``), torch analysis (``analyze``) and the zoo."""

from layerplan.netspec.spec import LAYER_KINDS, LayerSpec, NetSpec, find_boundary, single_cut

__all__ = ["LAYER_KINDS", "LayerSpec", "NetSpec", "find_boundary", "single_cut"]
