"""The Numba engine's loops of the quantized-output normalizations (a mixin of
:class:`normkernels.engine.numba_engine.NumbaEngine`)."""


class QuantizedLoops:
    pass
