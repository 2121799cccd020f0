"""Test data: dtypes, shapes, layouts and array generators shared by the tests."""

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float16), BFLOAT16, np.dtype(np.float32), np.dtype(np.float64)]
FLOAT_IDS = ["float16", "bfloat16", "float32", "float64"]
LAYOUTS = ["NCX", "NXC"]

# (N, C, *spatial) in NCX terms; NXC tests move C last.
SHAPES = {
    "1d": (7,),
    "2d": (5, 3),
    "3d": (2, 3, 5),
    "4d": (2, 3, 4, 5),
    "5d": (1, 3, 2, 3, 4),
    "N1": (1, 4, 6, 6),
    "C1": (3, 1, 17, 5),
    "spatial1": (4, 6, 1, 1),
    "odd": (3, 7, 33, 17),
    "planes49": (2, 9, 7, 7),
    "rows49": (40, 5, 7, 7),  # short planes, many rows: the rows moments kernel
    "parallel": (2, 17, 61, 67),  # above the serial threshold
}


def to_layout(shape, data_format):
    """NCX shape (N, C, *X) as laid out in ``data_format``."""
    if data_format == "NXC" and len(shape) > 2:
        return (shape[0], *shape[2:], shape[1])
    return shape


def random_tensor(rng, shape, dtype, mean=0.0, std=1.0):
    return (rng.standard_normal(shape) * std + mean).astype(dtype)


def random_params(rng, C, dtypes=(np.float32,) * 4, mean=0.0):
    """scale, B, mean, var with var > 0."""
    scale = rng.uniform(0.5, 2.0, C) * rng.choice([-1, 1], C)
    B = rng.standard_normal(C)
    m = rng.standard_normal(C) * 0.5 + mean
    var = rng.uniform(0.25, 4.0, C)
    return tuple(np.asarray(v).astype(d) for v, d in zip((scale, B, m, var), dtypes, strict=True))


def assert_identical(a, b):
    """Same dtype, shape and values, bit for bit, except that any NaN equals any NaN."""
    assert a.dtype == b.dtype and a.shape == b.shape
    fa = np.asarray(a, dtype=np.float64)
    fb = np.asarray(b, dtype=np.float64)
    nan = np.isnan(fa)
    assert np.array_equal(nan, np.isnan(fb))
    bits = np.dtype(f"u{a.dtype.itemsize}")
    assert np.array_equal(
        np.ascontiguousarray(a).view(bits)[~nan], np.ascontiguousarray(b).view(bits)[~nan]
    )
