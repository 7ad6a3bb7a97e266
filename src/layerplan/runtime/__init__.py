"""Run a plan for real on torch.distributed (gloo on CPU; NCCL on CUDA when asked).

- ``run_spec.RunSpec``: what to run (model, strategy + config, optimisation, data, bookkeeping).
- ``layout.layout(spec)``: which rank plays which role — the one place that decides it.
- ``roles/<strategy>.py``: the communication of one step, per role (ps, allreduce, stanza, ralp, hybrid).
- ``split.split_module``: head/tail GraphModules at a NetSpec layer (torch.fx), sharing parameters.
- ``data``: synthetic / digits / imagefolder, sharded deterministically by (step, worker).
- ``metrics``: per-rank step records → the Measurement dict (the Prediction's schema).
- ``checkpoint``: atomic per-rank files + latest.json; exact resume.
- ``launch.launch_local(spec)``: start the ranks locally, watch them, return the Measurement.
- ``worker``: the per-rank entry point (also for torchrun).
- ``reference.reference_run(spec)``: the single-process SGD a run must equal.
- ``commands.register``: the ``layerplan train`` subcommand.

Only this package (and netspec.analyze, zoo, calibrate) imports torch, always lazily.
"""
