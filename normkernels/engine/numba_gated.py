"""The Numba engine's loops of the gated RMSNorm and of QK-norm (a mixin of
:class:`normkernels.engine.numba_engine.NumbaEngine`)."""


class GatedLoops:
    pass
