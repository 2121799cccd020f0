"""Bad input gets a clear exception naming the argument and the rule."""

import numpy as np
import pytest
from arrays import BFLOAT16, random_params

import normkernels as nk

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)


def bn(X=None, params=None, **kw):
    X = np.zeros((2, 3, 4), F32) if X is None else X
    params = random_params(np.random.default_rng(0), 3) if params is None else params
    return nk.batch_normalization(X, *params, **kw)


def bni(X=None, params=None, **kw):
    X = np.zeros((2, 4, 3), F32) if X is None else X
    params = random_params(np.random.default_rng(0), 3) if params is None else params
    kw.setdefault("epsilon", 1e-5)
    return nk.batch_norm_inference(X, *params, **kw)


@pytest.mark.parametrize("kw,exc,match", [
    ({"X": np.zeros((2, 3, 4), np.int32)}, TypeError, "X has dtype int32"),
    ({"X": np.zeros((2, 3, 4), BFLOAT16), "opset": 9}, TypeError, "X has dtype bfloat16"),
    ({"params": random_params(np.random.default_rng(0), 3, (F16, F32, F32, F32))},
     TypeError, "scale, B share type T1"),
    ({"params": random_params(np.random.default_rng(0), 3, (F32, F32, F64, F32))},
     TypeError, "input_mean, input_var share type T2"),
    ({"params": random_params(np.random.default_rng(0), 3, (F64, F64, F32, F32)), "opset": 14},
     TypeError, "share type T"),
    ({"params": random_params(np.random.default_rng(0), 3, (F32, F32, F64, F64)), "opset": 6,
      "is_test": 1}, TypeError, "share type T"),
    ({"is_test": 1}, TypeError, "BatchNormalization-15 has no attribute 'is_test'"),
    ({"spatial": 1, "opset": 9}, TypeError, "BatchNormalization-9 has no attribute 'spatial'"),
    ({"training_mode": 0, "opset": 7}, TypeError, "no attribute 'training_mode'"),
    ({"consumed_inputs": [0], "opset": 6, "is_test": 1}, TypeError, "consumed_inputs"),
    ({"opset": 0}, ValueError, "opset must be an integer >= 1"),
    ({"opset": 14.0}, ValueError, "opset must be an integer"),
    ({"data_format": "NHWC"}, ValueError, "data_format must be one of"),
    ({"epsilon": float("nan")}, ValueError, "epsilon must be finite"),
    ({"epsilon": "small"}, TypeError, "epsilon must be a float"),
    ({"X": np.float32(1.0)}, ValueError, "at least 1 dimension"),
    ({"X": np.zeros((2, 3, 4), F32), "opset": 1, "is_test": 1, "consumed_inputs": [0]},
     ValueError, "X must be 4-D"),
    ({"X": np.zeros((2, 5, 4), F32)}, ValueError, r"scale must have shape \(5,\)"),
    ({"X": np.zeros((2, 3, 4), F32), "data_format": "NXC"}, ValueError,
     r"match the 4 channels"),
])
def test_batch_normalization_rejects(kw, exc, match):
    with pytest.raises(exc, match=match):
        bn(**kw)


def test_parameters_must_be_1d():
    params = list(random_params(np.random.default_rng(0), 3))
    params[3] = params[3].reshape(3, 1)
    with pytest.raises(ValueError, match=r"input_var must have shape \(3,\)"):
        bn(params=params)


@pytest.mark.parametrize("kw,exc,match", [
    ({"X": np.zeros((2, 4, 3), F64)}, TypeError, "input has dtype float64"),
    ({"params": random_params(np.random.default_rng(0), 3, (F16,) * 4)}, TypeError,
     "gamma has dtype float16"),
    ({"params": random_params(np.random.default_rng(0), 3, (BFLOAT16,) * 4)}, TypeError,
     "bfloat16 only when T1"),
    ({"params": random_params(np.random.default_rng(0), 3, (F32, F32, F32, BFLOAT16)),
      "X": np.zeros((2, 4, 3), BFLOAT16)}, TypeError, "share type T2"),
    ({"epsilon": 0.0}, ValueError, "epsilon must be positive"),
    ({"epsilon": -1e-5}, ValueError, "epsilon must be positive"),
    ({"epsilon": float("inf")}, ValueError, "epsilon must be finite"),
    ({"data_format": "NCHW"}, ValueError, "data_format must be one of"),
    ({"X": np.zeros((3,), F32)}, ValueError, "at least 2 dimensions"),
    ({"X": np.zeros((2, 3, 4), F32)}, ValueError, r"gamma must have shape \(4,\)"),
])
def test_batch_norm_inference_rejects(kw, exc, match):
    with pytest.raises(exc, match=match):
        bni(**kw)


def test_epsilon_is_required():
    X = np.zeros((2, 3), F32)
    with pytest.raises(TypeError, match="epsilon"):
        nk.batch_norm_inference(X, *random_params(np.random.default_rng(0), 3))


class TestOut:
    X = np.zeros((2, 3, 4), F32)

    def test_wrong_shape(self):
        with pytest.raises(ValueError, match="out must have the shape and dtype of X"):
            bn(X=self.X, out=np.empty((2, 3, 5), F32))

    def test_wrong_dtype(self):
        with pytest.raises(ValueError, match="out must have the shape and dtype of X"):
            bn(X=self.X, out=np.empty((2, 3, 4), F64))

    def test_not_an_array(self):
        with pytest.raises(TypeError, match=r"out must be a numpy\.ndarray"):
            bn(X=self.X, out=[0.0])

    def test_read_only(self):
        out = np.empty((2, 3, 4), F32)
        out.flags.writeable = False
        with pytest.raises(ValueError, match="out is read-only"):
            bn(X=self.X, out=out)

    def test_shares_memory_with_a_parameter(self):
        buf = np.zeros(24 + 3, F32)
        out = buf[:24].reshape(2, 3, 4)
        params = list(random_params(np.random.default_rng(0), 3))
        params[1] = buf[22:25]
        with pytest.raises(ValueError, match="out shares memory with B"):
            bn(X=self.X, params=params, out=out)

    def test_partial_overlap_with_x(self):
        buf = np.zeros(25, F32)
        X = buf[:24].reshape(2, 3, 4)
        out = buf[1:].reshape(2, 3, 4)
        with pytest.raises(ValueError, match="out overlaps X without being X"):
            bn(X=X, out=out)
        assert not buf.any()  # nothing was written

    def test_onednn_checks_out_too(self):
        with pytest.raises(ValueError, match="BatchNormInference: out must have"):
            bni(out=np.empty((2, 4, 4), F32))
