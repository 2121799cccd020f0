"""Drop-in torch.nn normalization modules computed by normkernels.

Each class subclasses torch.nn's own and overrides only ``forward``: the constructor
arguments, parameters, buffers, ``state_dict`` keys and ``isinstance`` checks are
torch's. :func:`replace_modules` therefore swaps a model's modules in place by
changing their class (the parameter objects stay, and with them an optimizer's
references). A forward that normkernels cannot run (a tensor off the CPU, a dtype
other than float16, bfloat16, float32 and float64, parameters of another dtype than
the input) runs torch's forward instead: the module stays correct wherever the model
goes.
"""

import torch
from torch import nn

from normkernels.torch import functional as F
from normkernels.torch.tensors import FLOATS

_FLOATS = frozenset(FLOATS)
_16_BIT = (torch.float16, torch.bfloat16)
_F32 = torch.float32


def ours(input, *params, mixed=False):
    """Whether normkernels computes this call (else torch's forward does): parameters
    of the input's dtype, or with ``mixed`` float32 parameters for 16-bit input (the
    autocast case, which BatchNormalization's types allow). On every module call: plain
    loops, no sets (a microsecond of a small LayerNorm's few)."""
    dtype = input.dtype
    if not input.is_cpu or dtype not in _FLOATS:
        return False
    wide = _F32 if mixed and dtype in _16_BIT else dtype
    for p in params:
        if p is not None and (not p.is_cpu or (p.dtype is not dtype and p.dtype is not wide)):
            return False
    return True


def ours_batch_norm(module, input):
    """Whether normkernels computes ``module``'s BatchNorm of ``input``."""
    return ours(input, module.weight, module.bias, module.running_mean, module.running_var,
                mixed=True)


def batch_norm(self, input):
    """torch.nn's BatchNorm forward of module ``self`` (its statistics, buffers and
    momentum rules) computed by normkernels."""
    self._check_input_dim(input)
    factor = 0.0 if self.momentum is None else self.momentum
    if self.training and self.track_running_stats and self.num_batches_tracked is not None:
        self.num_batches_tracked.add_(1)
        if self.momentum is None:  # a cumulative moving average
            factor = 1.0 / float(self.num_batches_tracked)
    batch_stats = self.training or (self.running_mean is None and self.running_var is None)
    keep = not self.training or self.track_running_stats
    return F.batch_norm(input, self.running_mean if keep else None,
                        self.running_var if keep else None, self.weight, self.bias,
                        batch_stats, factor, self.eps)


class _BatchNorm:
    def forward(self, input):
        if not ours_batch_norm(self, input):
            return super().forward(input)
        return batch_norm(self, input)


class BatchNorm1d(_BatchNorm, nn.BatchNorm1d):
    """``torch.nn.BatchNorm1d`` computed by normkernels.

    Parameters
    ----------
    num_features, eps, momentum, affine, track_running_stats, device, dtype, bias
        ``torch.nn.BatchNorm1d``'s constructor arguments.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> ours, theirs = nt.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    >>> x = torch.arange(24.0).reshape(4, 3, 2)
    >>> torch.allclose(ours(x), theirs(x)), torch.allclose(ours.running_var, theirs.running_var)
    (True, True)
    """


class BatchNorm2d(_BatchNorm, nn.BatchNorm2d):
    """``torch.nn.BatchNorm2d`` computed by normkernels.

    Parameters
    ----------
    num_features, eps, momentum, affine, track_running_stats, device, dtype, bias
        ``torch.nn.BatchNorm2d``'s constructor arguments.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> ours, theirs = nt.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    >>> x = torch.arange(48.0).reshape(2, 3, 2, 4).to(memory_format=torch.channels_last)
    >>> y = ours(x)
    >>> torch.allclose(y, theirs(x)), y.is_contiguous(memory_format=torch.channels_last)
    (True, True)
    """


class BatchNorm3d(_BatchNorm, nn.BatchNorm3d):
    """``torch.nn.BatchNorm3d`` computed by normkernels.

    Parameters
    ----------
    num_features, eps, momentum, affine, track_running_stats, device, dtype, bias
        ``torch.nn.BatchNorm3d``'s constructor arguments.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> ours, theirs = nt.BatchNorm3d(3).eval(), torch.nn.BatchNorm3d(3).eval()
    >>> x = torch.arange(48.0).reshape(2, 3, 2, 2, 2)
    >>> torch.allclose(ours(x), theirs(x))
    True
    """


class _InstanceNorm:
    def forward(self, input):
        if self.track_running_stats or not ours(input, self.weight, self.bias) \
                or input.dim() != self._get_no_batch_dim() + 1:
            return super().forward(input)
        return F.instance_norm(input, weight=self.weight, bias=self.bias, eps=self.eps)


class InstanceNorm1d(_InstanceNorm, nn.InstanceNorm1d):
    """``torch.nn.InstanceNorm1d`` computed by normkernels (``track_running_stats``
    and unbatched input: torch's forward).

    Parameters
    ----------
    num_features, eps, momentum, affine, track_running_stats, device, dtype, bias
        ``torch.nn.InstanceNorm1d``'s constructor arguments.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> ours, theirs = nt.InstanceNorm1d(3, affine=True), torch.nn.InstanceNorm1d(3, affine=True)
    >>> x = torch.arange(24.0).reshape(2, 3, 4)
    >>> torch.allclose(ours(x), theirs(x))
    True
    """


class InstanceNorm2d(_InstanceNorm, nn.InstanceNorm2d):
    """``torch.nn.InstanceNorm2d`` computed by normkernels.

    Parameters
    ----------
    num_features, eps, momentum, affine, track_running_stats, device, dtype, bias
        ``torch.nn.InstanceNorm2d``'s constructor arguments.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> ours, theirs = nt.InstanceNorm2d(3), torch.nn.InstanceNorm2d(3)
    >>> x = torch.arange(48.0).reshape(2, 3, 2, 4)
    >>> torch.allclose(ours(x), theirs(x), atol=1e-6)
    True
    """


class InstanceNorm3d(_InstanceNorm, nn.InstanceNorm3d):
    """``torch.nn.InstanceNorm3d`` computed by normkernels.

    Parameters
    ----------
    num_features, eps, momentum, affine, track_running_stats, device, dtype, bias
        ``torch.nn.InstanceNorm3d``'s constructor arguments.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> ours, theirs = nt.InstanceNorm3d(3), torch.nn.InstanceNorm3d(3)
    >>> x = torch.arange(48.0).reshape(2, 3, 2, 2, 2)
    >>> torch.allclose(ours(x), theirs(x), atol=1e-6)
    True
    """


class _GroupNorm:
    def forward(self, input):
        if not ours(input, self.weight, self.bias):
            return super().forward(input)
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)


class _LayerNorm:
    def forward(self, input):
        if not ours(input, self.weight, self.bias):
            return super().forward(input)
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class _RMSNorm:
    def forward(self, input):
        if not ours(input, self.weight):
            return super().forward(input)
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)


class GroupNorm(_GroupNorm, nn.GroupNorm):
    """``torch.nn.GroupNorm`` computed by normkernels.

    Parameters
    ----------
    num_groups, num_channels, eps, affine, device, dtype, bias
        ``torch.nn.GroupNorm``'s constructor arguments.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> ours, theirs = nt.GroupNorm(2, 4), torch.nn.GroupNorm(2, 4)
    >>> x = torch.arange(24.0).reshape(2, 4, 3)
    >>> torch.allclose(ours(x), theirs(x), atol=1e-6)
    True
    """


class LayerNorm(_LayerNorm, nn.LayerNorm):
    """``torch.nn.LayerNorm`` computed by normkernels.

    Parameters
    ----------
    normalized_shape, eps, elementwise_affine, bias, device, dtype
        ``torch.nn.LayerNorm``'s constructor arguments.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> ours, theirs = nt.LayerNorm((2, 3)), torch.nn.LayerNorm((2, 3))
    >>> x = torch.arange(24.0).reshape(4, 2, 3)
    >>> torch.allclose(ours(x), theirs(x), atol=1e-6)
    True
    """


class RMSNorm(_RMSNorm, nn.RMSNorm):
    """``torch.nn.RMSNorm`` computed by normkernels.

    Parameters
    ----------
    normalized_shape, eps, elementwise_affine, device, dtype
        ``torch.nn.RMSNorm``'s constructor arguments.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> ours, theirs = nt.RMSNorm(3), torch.nn.RMSNorm(3)
    >>> x = torch.arange(12.0).reshape(4, 3)
    >>> torch.allclose(ours(x), theirs(x))
    True
    """


# the forward of each torch.nn class, as a mixin a class with its semantics can take
_FORWARDS = {nn.BatchNorm1d: _BatchNorm, nn.BatchNorm2d: _BatchNorm, nn.BatchNorm3d: _BatchNorm,
             nn.InstanceNorm1d: _InstanceNorm, nn.InstanceNorm2d: _InstanceNorm,
             nn.InstanceNorm3d: _InstanceNorm, nn.GroupNorm: _GroupNorm,
             nn.LayerNorm: _LayerNorm, nn.RMSNorm: _RMSNorm}
SWAPS = {}  # class -> normkernels' class (exact classes: what replace_modules swaps)
_RESTORE = {}  # normkernels' class -> the class it was (kept after an unregister_swap)
_DECLINED = set()  # classes unregistered: no finder swaps them
FINDERS = []  # functions of a class: normkernels' class for it, or None (normkernels.torch.zoo)


def register_swap(cls, ours=None, *, like=None):
    """Have :func:`replace_modules` swap modules of exactly class ``cls``.

    Parameters
    ----------
    cls : type
        A ``torch.nn.Module`` class (a subclass of ``cls`` is not swapped: it may
        override ``forward``).
    ours : type, optional
        The class to give them: a subclass of ``cls`` (the swap changes an instance's
        class, so its parameters, buffers, hooks and ``state_dict`` stay).
    like : type, optional
        Instead of ``ours``: a torch.nn normalization class whose forward ``cls``
        computes (``cls`` subclasses it and keeps its semantics, as timm's
        ``LayerNorm`` keeps ``torch.nn.LayerNorm``'s); the class given is made from
        normkernels' forward for ``like`` and ``cls``.

    Returns
    -------
    type
        The class swapped in.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> class MyNorm(torch.nn.LayerNorm):
    ...     pass
    >>> ours = nt.register_swap(MyNorm, like=torch.nn.LayerNorm)
    >>> model = torch.nn.Sequential(MyNorm(8))
    >>> nt.replace_modules(model), isinstance(model[0], MyNorm)
    (['0'], True)
    >>> nt.restore_modules(model), type(model[0]) is MyNorm
    (['0'], True)
    >>> nt.unregister_swap(MyNorm)
    """
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f"register_swap: cls must be a torch.nn.Module class, got {cls!r}")
    if (ours is None) == (like is None):
        raise TypeError("register_swap: give ours (a subclass of cls) or like (a torch.nn "
                        "normalization class), not both or neither")
    if like is not None:
        if like not in _FORWARDS:
            raise ValueError(f"register_swap: like must be one of "
                             f"{', '.join(c.__name__ for c in _FORWARDS)}, got {like!r}")
        if not issubclass(cls, like):
            raise TypeError(f"register_swap: cls {cls.__name__} must subclass like "
                            f"({like.__name__}): normkernels' forward reads its attributes")
        ours = type(cls.__name__, (_FORWARDS[like], cls),
                    {"__module__": __name__, "__qualname__": cls.__qualname__,
                     "__doc__": f"``{cls.__module__}.{cls.__qualname__}`` computed by "
                                f"normkernels (the semantics of torch.nn.{like.__name__})."})
    elif not (isinstance(ours, type) and issubclass(ours, cls)):
        raise TypeError(f"register_swap: ours must be a subclass of cls ({cls.__name__}): "
                        f"the swap changes an instance's class, got {ours!r}")
    SWAPS[cls] = ours
    _RESTORE[ours] = cls
    _DECLINED.discard(cls)
    return ours


def unregister_swap(cls):
    """Stop swapping ``cls`` (modules already swapped are still restored), a model
    zoo's class too.

    Parameters
    ----------
    cls : type
        A class :func:`register_swap` registered, torch.nn's or a model zoo's.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> class MyNorm(torch.nn.LayerNorm):
    ...     pass
    >>> _ = nt.register_swap(MyNorm, like=torch.nn.LayerNorm)
    >>> nt.unregister_swap(MyNorm)
    >>> nt.replace_modules(torch.nn.Sequential(MyNorm(8), torch.nn.LayerNorm(8)))
    ['1']
    """
    SWAPS.pop(cls, None)
    _DECLINED.add(cls)


for _theirs, _ours_class in {nn.BatchNorm1d: BatchNorm1d, nn.BatchNorm2d: BatchNorm2d,
                             nn.BatchNorm3d: BatchNorm3d, nn.InstanceNorm1d: InstanceNorm1d,
                             nn.InstanceNorm2d: InstanceNorm2d,
                             nn.InstanceNorm3d: InstanceNorm3d, nn.GroupNorm: GroupNorm,
                             nn.LayerNorm: LayerNorm, nn.RMSNorm: RMSNorm}.items():
    register_swap(_theirs, _ours_class)


def replace_modules(model):
    """Swap every normalization module of ``model`` (itself included) whose class is
    registered (torch.nn's, those of :func:`register_swap`, and the model zoos'
    classes :mod:`normkernels.torch.zoo` recognizes) for normkernels' in
    place, keeping its parameters, buffers and hooks; returns the names of the swapped
    modules. Only exact classes are swapped (a subclass may override ``forward``);
    :func:`restore_modules` undoes it.

    Parameters
    ----------
    model : torch.nn.Module
        Changed in place.

    Returns
    -------
    list of str
        The names of the swapped modules (``named_modules``' names; ``""``: ``model``).

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> model = torch.nn.Sequential(torch.nn.BatchNorm1d(4), torch.nn.ReLU(),
    ...                             torch.nn.LayerNorm(3))
    >>> x = torch.arange(24.0).reshape(2, 4, 3)
    >>> want = model(x)
    >>> nt.replace_modules(model)
    ['0', '2']
    >>> type(model[0]) is nt.BatchNorm1d, isinstance(model[0], torch.nn.BatchNorm1d)
    (True, True)
    >>> torch.allclose(model(x), want, atol=1e-6)
    True
    """
    swapped = []
    for name, module in model.named_modules():
        cls = type(module)
        ours = SWAPS.get(cls)
        if ours is None and cls not in _DECLINED:
            ours = next(filter(None, (find(cls) for find in FINDERS)), None)
        if ours is not None:
            module.__class__ = ours
            swapped.append(name)
    return swapped


def restore_modules(model):
    """Give every normkernels module of ``model`` back its class; returns the names
    restored.

    Parameters
    ----------
    model : torch.nn.Module
        Changed in place.

    Returns
    -------
    list of str
        The names of the restored modules.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    >>> nt.replace_modules(model), nt.restore_modules(model)
    (['1'], ['1'])
    >>> type(model[1]) is torch.nn.LayerNorm
    True
    """
    restored = []
    for name, module in model.named_modules():
        theirs = _RESTORE.get(type(module))
        if theirs is not None:
            module.__class__ = theirs
            restored.append(name)
    return restored
