"""The roofline baselines ``normkernels bench`` times beside every workload (see
:mod:`normkernels.bench.workloads`): a parallel copy of X's bytes, a parallel
read-only sum, a plain parallel ``y = a * x + b`` and, for backward passes, a parallel
``dX = X + dY``, each over the workload's own arrays."""

import numpy as np

# Below this many bytes the copy baseline is NumPy's one-thread copy: a parallel
# launch (25-150 us to wake sleeping workers on a 2-core VM) is no bandwidth limit.
SERIAL_COPY_BYTES = 1 << 20


def _roofline_kernels():
    from numba import njit, prange

    @njit(parallel=True, cache=True)
    def parallel_copy(x, y):
        n = x.size
        chunks = 64
        for k in prange(chunks):
            lo = k * n // chunks
            hi = (k + 1) * n // chunks
            y[lo:hi] = x[lo:hi]

    @njit(parallel=True, cache=True)
    def parallel_add(x, z, y):  # one flat prange: an inner loop from k * n // chunks
        for i in prange(x.size):  # would not vectorise (4x slower)
            y[i] = x[i] + z[i]

    @njit(parallel=True, cache=True)
    def parallel_axpb(x, y, a, b):
        for i in prange(x.size):
            y[i] = x[i] * a + b

    @njit(parallel=True, cache=True, fastmath={"reassoc"})
    def parallel_read(x):
        total = 0.0
        for i in prange(x.size):
            total += x[i]
        return total

    return parallel_copy, parallel_axpb, parallel_read, parallel_add


def baseline_calls(X, out, other=None):
    """Roofline baselines over X's storage: copy (parallel; one thread below
    ``SERIAL_COPY_BYTES``), parallel a*x+b (on the bits for 16-bit dtypes, with
    ordinary stores), a parallel read-only sum, and with ``other`` (an array of X's
    shape and dtype: a backward pass's dY) ``add``: out = X + other (parallel; one
    thread below ``SERIAL_COPY_BYTES`` of X; on the bits for 16-bit dtypes)."""
    from normkernels.dtypes import storage_view

    parallel_copy, parallel_axpb, parallel_read, parallel_add = _roofline_kernels()
    x = storage_view(X.reshape(-1))
    y = storage_view(out.reshape(-1))
    z = None if other is None else storage_view(np.ascontiguousarray(other).reshape(-1))
    if X.dtype.itemsize == 2:  # a*x+b on the bits: same bytes and loop shape
        x, y = x.view(np.uint16), y.view(np.uint16)
        z = None if z is None else z.view(np.uint16)
        a, b = np.uint16(3), np.uint16(1)
    else:
        a, b = X.dtype.type(1.5), X.dtype.type(0.25)
    copy = lambda: parallel_copy(x, y)  # noqa: E731
    add = lambda: parallel_add(x, z, y)  # noqa: E731
    if x.nbytes < SERIAL_COPY_BYTES:  # a parallel launch would cost more than the copy
        copy = lambda: np.copyto(y, x)  # noqa: E731
        add = lambda: np.add(x, z, out=y)  # noqa: E731
    calls = {"copy": copy, "axpb": lambda: parallel_axpb(x, y, a, b),
             "read": lambda: parallel_read(x)}
    if z is not None:
        calls["add"] = add
    return calls
