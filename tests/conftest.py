import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id, so every test's data is reproducible."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _numba_label_counter():
    """Numba's global IR label counter (``numba.core.ir_utils._the_max_label``) about
    doubles with every inlining of an ``inline="always"`` overload; over the thousands of
    compiles of one test session its labels outgrow LLVM's name-length limit ("name is
    too long"). A compile needs it only above the labels of the function it is building,
    so each test starts it from 0. The package does not reset it yet (a process that
    compiles several hundred kernels could meet the limit): see the stop note."""
    from numba.core import ir_utils

    ir_utils._the_max_label._value = 0
    yield
