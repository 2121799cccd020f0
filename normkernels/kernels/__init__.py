"""The Numba kernels (imported on the first call of an operator, never at
``import normkernels``).

Threads: Numba's OpenMP layer lets idle workers spin for a while after each parallel
region (libgomp's default spin count, 300000). When other threads need the cores
between two kernels (OpenBLAS in a model's Conv, say), the spinning and their
spinning starve each other (ResNet-50 under ``onnx.reference``: see
``GOMP_SPINCOUNT`` in docs/design.md). Unless the user has chosen
(``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` set), the spin count is lowered to 1000
here, before Numba loads libgomp, at a small cost to tight loops of small calls. It
has no effect when libgomp was loaded by someone else first.
"""

import os

if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "1000"
