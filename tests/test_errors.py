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
    # the schema of BatchNormalization-1 requires consumed_inputs (no default)
    ({"X": np.zeros((2, 3, 4, 5), F32), "opset": 1, "is_test": 1}, TypeError,
     "BatchNormalization-1: attribute 'consumed_inputs' is required"),
    ({"X": np.zeros((2, 3, 4, 5), F32), "opset": 5, "is_test": 1}, TypeError,
     "'consumed_inputs' is required"),
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


# --- regressions: attribute checks that were missing or lenient ---

def test_saved_inv_std_of_zero_variance_gives_inf_without_a_warning():
    # once: NumPy's divide-by-zero RuntimeWarning leaked (an error under this suite)
    params = [np.ones(1, F32)] * 4
    outputs = nk.batch_normalization(np.array([0.5], F32), *params, opset=6, epsilon=0.0,
                                     num_outputs=5, saved_var="inv_std")
    assert outputs[4][0] == np.inf


@pytest.mark.parametrize("kw,exc,match", [
    ({"training_mode": "x"}, TypeError, r"training_mode must be an integer \(0 or 1\), got str"),
    ({"training_mode": [0]}, TypeError, "training_mode must be an integer"),
    ({"training_mode": 1.0}, TypeError, "training_mode must be an integer"),
    ({"training_mode": 2}, ValueError, "BatchNormalization-15: training_mode must be 0 or 1, "
                                       "got 2"),
    ({"training_mode": -1, "opset": 14}, ValueError, "training_mode must be 0 or 1, got -1"),
    ({"is_test": "no", "opset": 6}, TypeError, "is_test must be an integer, got str 'no'"),
    ({"is_test": 1.0, "opset": 6}, TypeError, "is_test must be an integer"),
    ({"is_test": [1], "opset": 1, "consumed_inputs": [0], "X": np.zeros((2, 3, 4, 5), F32)},
     TypeError, "is_test must be an integer"),
    ({"spatial": "x", "opset": 7}, TypeError, r"spatial must be an integer \(0 or 1\)"),
    ({"spatial": 2, "opset": 6, "is_test": 1}, ValueError, "spatial must be 0 or 1, got 2"),
    ({"spatial": 0.0, "opset": 7}, TypeError, "spatial must be an integer"),
])
def test_int_attributes_must_be_integers(kw, exc, match):
    with pytest.raises(exc, match=match):
        bn(**kw)


@pytest.mark.parametrize("kw", [
    {"training_mode": True}, {"training_mode": np.int64(1)}, {"training_mode": np.bool_(True)},
    {"opset": 6, "is_test": 2, "num_outputs": 1}, {"opset": 6, "is_test": np.int8(-1)},
    {"opset": 7, "spatial": np.int64(1)}, {"opset": 7, "spatial": True},
])
def test_int_attributes_take_any_integer_type(kw):
    assert isinstance(bn(**kw), (np.ndarray, tuple))


def test_is_test_nonzero_is_test_mode():
    # ONNX: "nonzero" means test mode, so is_test=2 has one output, Y
    with pytest.raises(ValueError, match=r"is_test=2 \(nonzero: test mode\) has one output"):
        bn(opset=6, is_test=2, num_outputs=3)
    assert bn(opset=6, is_test=-1).shape == (2, 3, 4)


@pytest.mark.parametrize("kw", [
    {"training_mode": 0}, {"opset": 9, "num_outputs": 1}, {"opset": 6, "is_test": 1},
    {"opset": 7}, {"training_mode": 1},
])
@pytest.mark.parametrize("momentum,exc,match", [
    ("x", TypeError, "momentum must be a float"),
    ("0.9", TypeError, "momentum must be a float"),
    (True, TypeError, "momentum must be a float"),
    (float("nan"), ValueError, "momentum must be finite"),
    (float("inf"), ValueError, "momentum must be finite"),
])
def test_momentum_is_checked_in_every_mode(kw, momentum, exc, match):
    with pytest.raises(exc, match=match):
        bn(momentum=momentum, **kw)


@pytest.mark.parametrize("call", ["bn", "bn-training", "in", "bni"])
@pytest.mark.parametrize("value", ["1e-3", b"1e-3", "nan", np.str_("1e-3"), np.array(1e-3),
                                   np.array([1e-3]), [1e-3]])
def test_float_attributes_refuse_strings_and_arrays(call, value):
    X = np.zeros((2, 3, 4), F32)
    with pytest.raises(TypeError, match="epsilon must be a float"):
        if call == "bn":
            bn(epsilon=value)
        elif call == "bn-training":
            bn(epsilon=value, training_mode=1)
        elif call == "in":
            nk.instance_normalization(X, np.ones(3, F32), np.ones(3, F32), epsilon=value)
        else:
            bni(epsilon=value)


@pytest.mark.parametrize("value", [1e-3, 1, np.float32(1e-3), np.float16(1e-3), np.int64(1),
                                   np.uint8(1), BFLOAT16.type(1e-3)])
def test_float_attributes_take_real_numbers(value):
    assert bn(epsilon=value, momentum=value).shape == (2, 3, 4)
    assert bni(epsilon=value).shape == (2, 4, 3)


def test_float_attribute_beyond_float64_is_a_value_error():
    with pytest.raises(ValueError, match="epsilon must be finite"):
        bn(epsilon=10**400)
    with pytest.raises(ValueError, match="momentum must be finite"):
        bn(momentum=-(10**400))


@pytest.mark.parametrize("kw", [
    {}, {"training_mode": 1}, {"opset": 14}, {"opset": 9}, {"opset": 9, "num_outputs": 1},
    {"opset": 7, "num_outputs": 3}, {"opset": 6, "is_test": 1},
])
@pytest.mark.parametrize("saved_var", ["std", "Variance", None, b"variance", ["inv_std"]])
def test_saved_var_is_checked_at_every_opset_and_mode(kw, saved_var):
    with pytest.raises(ValueError, match="saved_var must be one of"):
        bn(saved_var=saved_var, **kw)


@pytest.mark.parametrize("opset", [np.int64(15), np.int32(14), np.uint8(9), np.int16(6),
                                   np.int64(7), np.int64(100)])
def test_opset_may_be_a_numpy_integer(opset):
    expected = bn(opset=int(opset))
    np.testing.assert_array_equal(bn(opset=opset), expected)


@pytest.mark.parametrize("opset", [np.int64(22), np.int32(6), np.uint8(1)])
def test_instance_normalization_opset_may_be_a_numpy_integer(opset):
    X = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(F32)
    p = np.ones(3, F32)
    np.testing.assert_array_equal(nk.instance_normalization(X, p, p, opset=opset),
                                  nk.instance_normalization(X, p, p, opset=int(opset)))


@pytest.mark.parametrize("opset", [np.bool_(True), True, np.float64(15.0), "15", [15], (15,),
                                   np.int64(0), np.array(15), None])
@pytest.mark.parametrize("op", ["bn", "in"])
def test_opset_refuses_non_integers(op, opset):
    # [15] once raised functools.cache's "unhashable type", which names no argument
    X = np.zeros((2, 3, 4), F32)
    with pytest.raises(ValueError, match="opset must be an integer >= 1"):
        if op == "bn":
            bn(opset=opset)
        else:
            nk.instance_normalization(X, np.ones(3, F32), np.ones(3, F32), opset=opset)


def test_num_outputs_may_be_a_numpy_integer():
    outputs = bn(opset=9, num_outputs=np.int64(3))
    assert isinstance(outputs, tuple) and len(outputs) == 3
