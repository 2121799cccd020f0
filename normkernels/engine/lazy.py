"""Kernel modules imported at their first use, not with the engine.

Importing a kernel module defines its dispatchers (a Numba object, a cache locator and
a source stamp each): all of them took about half of what ``import normkernels`` and
the first call add to ``import numba`` in a process whose kernels come from the disk
cache. The engine names each kernel module it uses as ``lazy(__name__, alias,
module)``: the module is imported at the first attribute read, and the engine's name
then points to the module itself, so later reads cost what a module's do.
"""

import importlib
import sys


class LazyModule:
    """Stands for ``normkernels.kernels.<module>`` under the name ``alias`` of module
    ``owner`` until an attribute is read."""

    __slots__ = ("_alias", "_module", "_owner")

    def __init__(self, owner, alias, module):
        self._owner, self._alias, self._module = owner, alias, module

    def __getattr__(self, attr):
        module = importlib.import_module(f"normkernels.kernels.{self._module}")
        owner = sys.modules.get(self._owner)
        if owner is not None and getattr(owner, self._alias, None) is self:
            setattr(owner, self._alias, module)
        return getattr(module, attr)

    def __repr__(self):
        return f"<kernel module normkernels.kernels.{self._module}, not imported yet>"


def lazy(owner, alias, module=None):
    """The kernel module ``module`` (default ``alias``) for the name ``alias`` of the
    module named ``owner`` (its ``__name__``)."""
    return LazyModule(owner, alias, module or alias)
