"""The NumPy twins of the quantized-output normalizations' engine methods (a mixin of
:class:`normkernels.reference.NumPyEngine`)."""


class QuantizedTwins:
    pass
