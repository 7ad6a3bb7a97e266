"""layerplan: plan, predict and run distributed training of neural networks.

One cost model, one planner and one runtime for five published systems: PALEO, Yan et al.
(KDD'15), Omnivore, Stanza and RALP. The pure core (``netspec.spec``, ``hardware``, ``cost``,
``strategies``, ``plan``) imports no torch; only ``netspec.analyze``, ``netspec.zoo``,
``runtime`` and ``calibrate`` do, lazily.
"""

__version__ = "0.1.0"
