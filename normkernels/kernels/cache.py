"""On-disk cache of compiled kernels, invalidated when any kernel source changes.

Kernels are compiled lazily, on first call per signature, with ``cache=True``; the
cache lives in ``__pycache__`` beside the sources or, when ``NUMBA_CACHE_DIR`` is set,
there (Numba's own setting). Numba checks only the stamp of the file that defines a
kernel, so an edit to a helper it calls (``elements.py``, ``vectors.py``) would
otherwise leave a stale binary in use. Kernel modules import this module first; it
registers locators whose source stamp covers every file of this package: loops only
(the choice among kernels lives in :mod:`normkernels.engine`, so tuning a threshold
keeps the cache).

This uses Numba's locator classes (``numba.core.caching``), which are not public API;
if they change, the registration is skipped and Numba's per-file stamp applies. The
same goes for the reading of cache files, made tolerant of corrupt files below.
"""

import contextlib
import hashlib
import itertools
from pathlib import Path

import normkernels.kernels.inlining  # noqa: F401  (faster inlining, before any compile)

_KERNEL_DIR = Path(__file__).resolve().parent
_CACHE_DIRS = set()  # where the locators below put this package's kernels
_WRITABLE = set()  # cache directories found writable in this process



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
                locator = super().from_function(py_func, py_file)
                if locator is not None:
                    _CACHE_DIRS.add(str(Path(locator.get_cache_path()).resolve()))
                return locator

            def get_source_stamp(self):
                return stamp

            def ensure_cache_path(self):
                # Numba checks that the directory is writable by creating a file in
                # it, for every kernel at its definition (200 of them at import):
                # once per directory and process is enough
                path = self.get_cache_path()
                if path not in _WRITABLE:
                    super().ensure_cache_path()
                    _WRITABLE.add(path)

        PackageStampedLocator.__name__ = "PackageStamped" + base.__name__
        ours.append(PackageStampedLocator)
    registered = {k.__name__ for k in impl._locator_classes}
    impl._locator_classes[:0] = [c for c in ours if c.__name__ not in registered]


_register()


_warned = []


@contextlib.contextmanager
def _index_lock(index_path):
    """An exclusive lock on a cache index, held across processes (``flock`` on a file
    beside it; where there is no ``fcntl``, no lock: Numba's own behaviour)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(f"{index_path}.lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tolerate_unreadable_files():
    """A corrupt or truncated cache file of a normkernels kernel is a cache miss (the
    kernel recompiles and the file is rewritten), with one warning per process;
    Numba itself raised the unpickling error into the caller's call."""
    import warnings

    try:
        from numba.core.caching import IndexDataCacheFile
    except ImportError:  # pragma: no cover
        return
    if getattr(IndexDataCacheFile, "_normkernels_tolerant", False):
        return
    load_index, load_data = IndexDataCacheFile._load_index, IndexDataCacheFile._load_data
    numba_save = IndexDataCacheFile.save

    def ours(cache_file):
        index = getattr(cache_file, "_index_path", None)
        return index is not None and str(Path(index).resolve().parent) in _CACHE_DIRS

    def warn(path, exc):
        if not _warned:
            _warned.append(path)
            warnings.warn(f"normkernels: ignoring an unreadable kernel cache file ({path}: "
                          f"{type(exc).__name__}); recompiling", RuntimeWarning, stacklevel=2)

    def _load_index(self):
        try:
            return load_index(self)
        except Exception as exc:
            if not ours(self):
                raise
            warn(self._index_path, exc)
            return {}

    def _load_data(self, name):
        try:
            return load_data(self, name)
        except OSError:
            raise
        except Exception as exc:
            if not ours(self):
                raise
            warn(name, exc)
            raise OSError(f"unreadable cache data {name}") from exc  # Numba: a cache miss

    def _save(self, key, data):
        # Numba's save reads the index, picks the first free data-file number and writes
        # the index back: two processes compiling kernels of one function at once (a
        # parallel warm-up, pytest-xdist workers) each lose the other's entry, or give
        # two signatures one data file, so that one of them later loads the other's
        # code. Under an exclusive lock on the index, re-read it, write the data under
        # its name, then the index that names it.
        if not ours(self):
            return numba_save(self, key, data)
        with _index_lock(self._index_path):
            overloads = self._load_index()
            name = overloads.get(key)
            if name is None:
                taken = set(overloads.values())
                name = next(n for n in map(self._data_name, itertools.count(1))
                            if n not in taken)
            self._save_data(name, data)
            if overloads.get(key) != name:
                overloads[key] = name
                self._save_index(overloads)

    IndexDataCacheFile._load_index = _load_index
    IndexDataCacheFile._load_data = _load_data
    IndexDataCacheFile.save = _save
    IndexDataCacheFile._normkernels_tolerant = True


_tolerate_unreadable_files()


def _load_without_refresh():
    """A normkernels kernel loads from the disk cache without ``refresh()`` of the
    target context. Numba refreshes it before every cache lookup: that imports and
    installs every typing and lowering registry (0.1-0.2 s, a third of a process's
    first call with a warm cache), which a compile needs and a load does not; a load
    needs only Numba's runtime (NRT) started, and a later compile refreshes the
    context itself."""
    try:
        from numba.core.caching import Cache
        from numba.core.runtime import rtsys
    except ImportError:  # pragma: no cover
        return
    if getattr(Cache, "_normkernels_light_load", False):
        return
    numba_load = Cache.load_overload

    def load_overload(self, sig, target_context):
        impl = getattr(self, "_impl", None)
        if not type(getattr(impl, "locator", None)).__name__.startswith("PackageStamped"):
            return numba_load(self, sig, target_context)
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)

    Cache.load_overload = load_overload
    Cache._normkernels_light_load = True


_load_without_refresh()


def serial_twin(dispatcher, **options):
    """A one-thread copy of a ``parallel=True`` kernel (``prange`` runs as ``range``):
    the same source and arithmetic, so the same bits, under its own name in the disk
    cache. For where a parallel launch is not allowed (a child forked from a process
    that used GNU OpenMP, which Numba terminates on its first parallel call)."""
    import types

    from numba import njit

    fn = dispatcher.py_func
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_serial",
                              fn.__defaults__, fn.__closure__)
    copy.__qualname__ = fn.__qualname__ + "_serial"
    copy.__module__ = fn.__module__
    copy.__doc__ = f"One-thread twin of :func:`{fn.__name__}`."
    return njit(**options)(copy)
