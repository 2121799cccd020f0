"""Compile options and vector geometry shared by every kernel, set in one place.

No fast-math anywhere: NaN and Inf must propagate, FMA contraction would make the
vector and scalar paths round differently, and a reduction LLVM vectorises by
reassociation sums in an order set by the target's vector width, and contracts only
where the target has FMA (other bits on every CPU). Reductions fix their order in the
source instead, with the lane vectors of :mod:`normkernels.kernels.lanes`: the same
bits on every target and for any thread count.
"""

KERNEL_OPTIONS = dict(cache=True, nogil=True, error_model="numpy", boundscheck=False)
INLINE_OPTIONS = dict(KERNEL_OPTIONS, inline="always")
# Functions only kernels call, and overloads: no Python or C wrapper (each is code to
# lower and optimise, a fifth of a small helper's compile). An overload's own
# dispatcher is not cached on disk (its caller's code is).
HELPER_OPTIONS = dict(KERNEL_OPTIONS, no_cpython_wrapper=True, no_cfunc_wrapper=True)
OVERLOAD_OPTIONS = dict(error_model="numpy", boundscheck=False, no_cpython_wrapper=True,
                        no_cfunc_wrapper=True)

# Every vector operation of the kernels handles 64 bytes (one cache line, one
# AVX-512 register): 16 float32, 8 float64 or 32 16-bit elements.
VECTOR_BYTES = 64
MAX_LANES = VECTOR_BYTES // 2  # elements per vector at the narrowest dtype (16-bit)
# The planes loop needs planes of at least one vector of the narrowest dtype: a
# vector then straddles at most two planes.
MIN_PLANE = MAX_LANES
# Parameter tables of the periodic loop carry this many entries of wrap-around past
# one period, so a vector starting at any phase reads inside the table.
TABLE_PAD = MAX_LANES
# Row normalizations: rows shorter than this take inlined float64 statistics (a call
# of the blocked reductions costs more than such a row) and are never split.
SHORT_ROW = 64
