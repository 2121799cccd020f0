"""The NumPy twins of the gated RMSNorm's and QK-norm's engine methods (a mixin of
:class:`normkernels.reference.NumPyEngine`)."""


class GatedTwins:
    pass
