"""On-disk cache of compiled kernels, invalidated when any kernel source changes.

Kernels are compiled lazily, on first call per signature, with ``cache=True``; the
cache lives in ``__pycache__`` beside the sources or, when ``NUMBA_CACHE_DIR`` is set,
there (Numba's own setting). Numba checks only the stamp of the file that defines a
kernel, so an edit to a helper it calls (``elements.py``, ``vectors.py``) would
otherwise leave a stale binary in use. Kernel modules import this module first; it
registers locators whose source stamp covers every file of this package.

This uses Numba's locator classes (``numba.core.caching``), which are not public API;
if they change, the registration is skipped and Numba's per-file stamp applies.
"""

import hashlib
from pathlib import Path

_KERNEL_DIR = Path(__file__).resolve().parent


def _package_stamp():
    digest = hashlib.sha256()
    for path in sorted(_KERNEL_DIR.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _register():
    try:
        from numba.core import caching
    except ImportError:  # pragma: no cover - numba without the module
        return
    bases = [
        getattr(caching, name, None)
        for name in ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")
    ]
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    if impl is None or None in bases or not hasattr(impl, "_locator_classes"):
        return
    stamp = _package_stamp()
    ours = []
    for base in bases:

        class PackageStampedLocator(base):
            @classmethod
            def from_function(cls, py_func, py_file):
                if Path(py_file).resolve().parent != _KERNEL_DIR:
                    return None
                return super().from_function(py_func, py_file)

            def get_source_stamp(self):
                return stamp

        PackageStampedLocator.__name__ = "PackageStamped" + base.__name__
        ours.append(PackageStampedLocator)
    registered = {k.__name__ for k in impl._locator_classes}
    impl._locator_classes[:0] = [c for c in ours if c.__name__ not in registered]


_register()
