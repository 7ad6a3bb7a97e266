"""The cost core (pure Python, no torch): PALEO layer times (``compute``), communication schemes
(``collectives``) and the one engine that turns a strategy's StepGraph into a Prediction
(``engine``)."""

from layerplan.cost.collectives import ALLREDUCE, SCHEMES, CollectiveCost, collective_cost, recursive_doubling_rounds
from layerplan.cost.compute import ConvGeometry, check_fits, fwd_bwd_time_s, layer_time_s, peak_memory_bytes, phase_time_s
from layerplan.cost.engine import Collective, Compute, Delay, Prediction, StepGraph, TimelineEntry, Transfer, iteration_name, simulate

__all__ = [
    "ALLREDUCE", "SCHEMES", "Collective", "CollectiveCost", "Compute", "ConvGeometry", "Delay", "Prediction", "StepGraph",
    "TimelineEntry", "Transfer", "check_fits", "collective_cost", "fwd_bwd_time_s", "iteration_name", "layer_time_s",
    "peak_memory_bytes", "phase_time_s", "recursive_doubling_rounds", "simulate",
]
