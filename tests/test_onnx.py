"""ONNX integration: conformance on ONNX's own test cases, run_node semantics, the
ReferenceEvaluator drop-in, and a cross-check against onnxruntime.

Sources of cases (all from the installed onnx package, none written here):
node cases regenerated from ``onnx.backend.test.case.node``; the "pytorch-converted"
BatchNorm*d and "pytorch-operator" InstanceNorm directories; the light model zoo.
Tolerances are ONNX's own (``Runner.assert_similar_outputs``).
"""

import glob
import importlib
import os

import numpy as np
import pytest
from oracle import batch_norm, batch_norm_training, instance_norm

onnx = pytest.importorskip("onnx", reason="onnx not installed (pip install normkernels[onnx])")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import normkernels  # noqa: E402
import normkernels.onnx as nko  # noqa: E402

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)


def _node_cases():
    """ONNX's node test cases of the operators, regenerated from their sources (the
    one-node models; the expanded function bodies are other operators)."""
    import onnx.backend.test.case.node as node_cases

    node_cases._TargetOpType = None
    for module in ("batch_normalization", "instance_normalization", "layernormalization",
                   "rmsnormalization", "groupnormalization", "meanvariancenormalization",
                   "lpnormalization", "lrn"):
        with np.errstate(all="ignore"):  # ONNX's expected outputs of zero vectors divide 0/0
            importlib.import_module(f"onnx.backend.test.case.node.{module}")
    return [case for case in node_cases._NodeTestCases
            if len(case.model.graph.node) == 1
            and case.model.graph.node[0].op_type in nko.SUPPORTED]


NODE_CASES = _node_cases()
DATA_DIRS = [*sorted(glob.glob(os.path.join(DATA, "pytorch-converted", "test_BatchNorm*"))),
             os.path.join(DATA, "pytorch-operator", "test_operator_symbolic_override")]
LIGHT_MODELS = {"resnet50": 1e-3, "densenet121": 2e-3, "inception_v2": 1e-3,
                "shufflenet": 1e-3,  # BatchNormalization
                "bvlc_alexnet": 1e-3, "inception_v1": 1e-3, "zfnet512": 1e-3,  # LRN
                }  # name -> rtol, as onnx.backend.test.case.model


def model_opset(model):
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def graph_inputs(model):
    initializers = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def evaluate(model, feeds):
    return ReferenceEvaluator(model, new_ops=nko.reference_ops()).run(None, feeds)


def test_cases_were_found():
    ops = [case.model.graph.node[0].op_type for case in NODE_CASES]
    # onnx 1.23: 4 BatchNormalization, 2 InstanceNormalization, and many of the others
    assert ops.count("BatchNormalization") >= 4 and ops.count("InstanceNormalization") >= 2
    assert ops.count("LayerNormalization") >= 19 and ops.count("RMSNormalization") >= 10
    assert ops.count("GroupNormalization") >= 2 and ops.count("MeanVarianceNormalization") >= 1
    assert all(os.path.isdir(d) for d in DATA_DIRS) and len(DATA_DIRS) == 6


@pytest.mark.parametrize("case", NODE_CASES, ids=lambda c: c.name)
def test_onnx_node_cases(case):
    model = case.model
    (node,) = model.graph.node
    for inputs, expected in case.data_sets:
        got = [g for g in nko.run_node(node, inputs, model_opset(model)) if g is not None]
        Runner.assert_similar_outputs(expected, got, rtol=case.rtol, atol=case.atol)
        names = [i.name for i in graph_inputs(model)]
        got = evaluate(model, dict(zip(names, inputs, strict=True)))
        Runner.assert_similar_outputs(expected, got, rtol=case.rtol, atol=case.atol)


def _load_data_set(directory):
    def load(pattern):
        files = sorted(glob.glob(os.path.join(directory, pattern)),
                       key=lambda f: int(f.rsplit("_", 1)[1].split(".")[0]))
        return [numpy_helper.to_array(onnx.load_tensor(f)) for f in files]

    return load("input_*.pb"), load("output_*.pb")


@pytest.mark.parametrize("directory", DATA_DIRS, ids=os.path.basename)
def test_onnx_data_cases(directory):
    model = onnx.load(os.path.join(directory, "model.onnx"))
    assert any(n.op_type in nko.SUPPORTED for n in model.graph.node)
    data_sets = sorted(glob.glob(os.path.join(directory, "test_data_set_*")))
    assert data_sets
    names = [i.name for i in graph_inputs(model)]
    for data_set in data_sets:
        inputs, expected = _load_data_set(data_set)
        got = evaluate(model, dict(zip(names, inputs, strict=True)))
        Runner.assert_similar_outputs(expected, got, rtol=1e-3, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LIGHT_MODELS))
def test_light_models(name):
    """Whole models of the light zoo (dummy inputs, as ONNX's runner makes them)."""
    model = onnx.load(os.path.join(DATA, "light", f"light_{name}.onnx"))
    ours = [n.op_type for n in model.graph.node if n.op_type in nko.SUPPORTED]
    assert ours.count("BatchNormalization") >= 49 or ours.count("LRN") == 2
    feeds = {x.name: Runner.generate_dummy_data(x, seed=0, name=name, random=False)
             for x in graph_inputs(model)}
    expected = numpy_helper.to_array(
        onnx.load_tensor(os.path.join(DATA, "light", f"light_{name}_output_0.pb")))
    got = evaluate(model, feeds)
    Runner.assert_similar_outputs([expected], got[:1], rtol=LIGHT_MODELS[name], atol=1e-7)


# --- run_node semantics ---

def bn_node(outputs=("y",), **attrs):
    return helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], list(outputs),
                            **attrs)


def bn_inputs(rng, shape=(2, 3, 4, 5), dtype=F32):
    C = shape[1]
    X = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
    params = [rng.uniform(0.5, 2, C), rng.standard_normal(C), rng.standard_normal(C),
              rng.uniform(0.5, 2, C)]
    return [X, *(p.astype(dtype) for p in params)]


def assert_close(got, exact, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(got, np.float64), exact, rtol=rtol, atol=atol)


@pytest.mark.parametrize("opset", [6, 7, 9, 14, 15])
def test_inference_node_at_every_opset(rng, opset):
    inputs = bn_inputs(rng)
    attrs = {"is_test": 1} if opset == 6 else {}
    (y,) = nko.run_node(bn_node(**attrs), inputs, opset)
    assert_close(y, batch_norm(*inputs, 1e-5))


def test_opset_9_inference_ignores_momentum(rng):
    """The reference normalizes with blended running statistics when momentum is set;
    the spec uses input_mean and input_var."""
    inputs = bn_inputs(rng)
    (y,) = nko.run_node(bn_node(momentum=0.5), inputs, 9)
    assert_close(y, batch_norm(*inputs, 1e-5))


@pytest.mark.parametrize("opset,outputs,attrs", [
    (1, ["y", "rm", "rv", "sm", "sv"], {"consumed_inputs": [0, 0, 0, 1, 1]}),
    (6, ["y", "rm", "rv", "sm", "sv"], {}),
    (7, ["y", "rm", "rv", "sm", "sv"], {}),
    (9, ["y", "rm", "rv"], {}),
    (9, ["y", "", "", "sm"], {}),
    (14, ["y", "rm", "rv"], {"training_mode": 1}),
    (15, ["y", "", "rv"], {"training_mode": 1}),
])
def test_training_node_outputs(rng, opset, outputs, attrs):
    inputs = bn_inputs(rng)
    got = nko.run_node(bn_node(outputs, momentum=0.8, **attrs), inputs, opset)
    assert len(got) == len(outputs)
    Y, rm, rv, mean, var = batch_norm_training(*inputs, 1e-5, 0.8)
    for name, value, exact in zip(outputs, got, [Y, rm, rv, mean, var], strict=False):
        if not name:
            assert value is None
        else:
            assert_close(value, exact)


def test_training_node_in_the_evaluator_uses_the_model_opset(rng):
    """Opset 7: five outputs mean training, whatever the latest schema's defaults."""
    inputs = bn_inputs(rng)
    node = bn_node(["y", "rm", "rv", "sm", "sv"], momentum=0.8)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "xsbmv"],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
         for n in ["y", "rm", "rv", "sm", "sv"]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)])
    got = evaluate(model, dict(zip("xsbmv", inputs, strict=True)))
    for value, exact in zip(got, batch_norm_training(*inputs, 1e-5, 0.8), strict=True):
        assert_close(value, exact)


def test_instance_node(rng):
    X = rng.standard_normal((2, 3, 5, 6)).astype(F32)
    s, b = rng.standard_normal(3).astype(F32), rng.standard_normal(3).astype(F32)
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)
    for opset in (1, 6, 22):
        (y,) = nko.run_node(node, [X, s, b], opset)
        assert_close(y, instance_norm(X, s, b, 1e-3)[0])


def test_unsupported_nodes_are_named():
    with pytest.raises(NotImplementedError, match="operator 'Relu'"):
        nko.run_node(helper.make_node("Relu", ["x"], ["y"]), [], 21)
    with pytest.raises(NotImplementedError, match=r"domain 'com\.microsoft'"):
        nko.run_node(helper.make_node("BatchNormalization", list("xsbmv"), ["y"],
                                      domain="com.microsoft"), [], 15)
    with pytest.raises(ValueError, match="expected 5 inputs"):
        nko.run_node(bn_node(), [np.zeros((2, 3))], 15)


def test_attribute_not_in_the_opset_is_named(rng):
    with pytest.raises(TypeError, match="BatchNormalization-9 has no attribute 'spatial'"):
        nko.run_node(bn_node(spatial=1), bn_inputs(rng), 9)


def test_helpers_match_the_reference_helpers(rng):
    from onnx.reference.ops import op_batch_normalization as ref

    inputs = bn_inputs(rng)
    np.testing.assert_allclose(nko._batchnorm_test_mode(*inputs),
                               ref._batchnorm_test_mode(*inputs), rtol=1e-5, atol=1e-6)
    ours = nko._batchnorm_training_mode(*inputs, momentum=0.7, epsilon=1e-4)
    theirs = ref._batchnorm_training_mode(*inputs, momentum=0.7, epsilon=1e-4)
    assert len(ours) == len(theirs) == 5
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_instance_helper_does_not_overflow_in_float16(rng):
    """ONNX's float16 variance overflows on a 512 x 512 plane; ours does not."""
    X = rng.standard_normal((1, 1, 512, 512)).astype(F16)
    s, b = np.ones(1, F16), np.full(1, 0.5, F16)
    y = nko._instancenorm_test_mode(X, s, b)
    assert y.dtype == F16 and np.isfinite(y.astype(np.float64)).all()
    assert_close(y, instance_norm(X, s, b, 1e-5)[0], rtol=2e-3, atol=2e-3)


# --- onnxruntime cross-check ---

_ORT_TYPES = {F16: TensorProto.FLOAT16, F32: TensorProto.FLOAT, F64: TensorProto.DOUBLE}


def ort_session(node, opset, dtype, n_inputs, output_types=None):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed")
    names = list(node.input)[:n_inputs]
    outputs = [n for n in node.output if n]
    types = output_types or [_ORT_TYPES[dtype]] * len(outputs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, _ORT_TYPES[dtype], None) for n in names],
        [helper.make_tensor_value_info(n, t, None) for n, t in zip(outputs, types,
                                                                   strict=True)])
    imports = [helper.make_opsetid("", opset)]
    if node.domain:
        imports.append(helper.make_opsetid(node.domain, 1))
    # onnxruntime 1.31 rejects IR version 14 models
    model = helper.make_model(graph, opset_imports=imports, ir_version=10)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]), names


@pytest.mark.parametrize("dtype", [F16, F32, F64], ids=["float16", "float32", "float64"])
@pytest.mark.parametrize("opset,outputs,attrs", [
    (7, ["y"], {}), (9, ["y"], {}), (14, ["y"], {}), (15, ["y"], {}),
    (9, ["y", "rm", "rv", "sm", "sv"], {}),
    (14, ["y", "rm", "rv"], {"training_mode": 1}),
    (15, ["y", "rm", "rv"], {"training_mode": 1}),
])
def test_agrees_with_onnxruntime(rng, dtype, opset, outputs, attrs):
    node = bn_node(outputs, momentum=0.8, **attrs)
    try:
        session, names = ort_session(node, opset, dtype, 5)
    except pytest.skip.Exception:
        raise
    except Exception as exc:  # a node onnxruntime has no kernel for
        pytest.skip(f"onnxruntime cannot run BatchNormalization-{opset} {dtype}: "
                    f"{str(exc).splitlines()[0][:120]}")
    inputs = bn_inputs(rng, (4, 3, 6, 7), dtype)
    theirs = session.run(None, dict(zip(names, inputs, strict=True)))
    # onnxruntime returns saved_var as 1/sqrt(var + epsilon): compare with that switch
    ours = nko.run_node(node, inputs, opset)
    if len(outputs) == 5:
        inv_std = normkernels.batch_normalization(*inputs, momentum=0.8, opset=opset,
                                                  num_outputs=5, saved_var="inv_std")[4]
        ours = [*ours[:4], inv_std]
    tol = 2e-3 if dtype == F16 else 1e-5
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol,
                                   atol=tol)


@pytest.mark.parametrize("dtype", [F16, F32], ids=["float16", "float32"])
def test_instance_agrees_with_onnxruntime(rng, dtype):
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)
    session, names = ort_session(node, 22, dtype, 3)
    X = rng.standard_normal((2, 4, 9, 11)).astype(dtype)
    s, b = rng.standard_normal(4).astype(dtype), rng.standard_normal(4).astype(dtype)
    (theirs,) = session.run(None, dict(zip(names, [X, s, b], strict=True)))
    (ours,) = nko.run_node(node, [X, s, b], 22)
    tol = 2e-3 if dtype == F16 else 1e-5
    np.testing.assert_allclose(ours.astype(np.float64), theirs.astype(np.float64), rtol=tol,
                               atol=tol)


# --- row normalizations: run_node semantics and onnxruntime ---

ROW_NODES = {  # name -> (node, opset, number of inputs, output types of onnxruntime's schema)
    "LayerNormalization": (helper.make_node("LayerNormalization", ["x", "s", "b"],
                                            ["y", "mean", "inv"], axis=-1, epsilon=1e-5),
                           17, 3, [None, TensorProto.FLOAT, TensorProto.FLOAT]),
    "RMSNormalization": (helper.make_node("RMSNormalization", ["x", "s"], ["y"], epsilon=1e-5),
                         23, 2, [None]),
    "SimplifiedLayerNormalization": (helper.make_node("SimplifiedLayerNormalization",
                                                      ["x", "s"], ["y", "inv"], epsilon=1e-5),
                                     17, 2, [None, TensorProto.FLOAT]),
    "SkipLayerNormalization": (helper.make_node("SkipLayerNormalization",
                                                ["x", "k", "s", "b", "bias"],
                                                ["y", "mean", "inv", "sum"], epsilon=1e-5,
                                                domain="com.microsoft"),
                               17, 5, [None, TensorProto.FLOAT, TensorProto.FLOAT, None]),
    "SkipSimplifiedLayerNormalization": (helper.make_node("SkipSimplifiedLayerNormalization",
                                                          ["x", "k", "s", "bias"],
                                                          ["y", "mean", "inv", "sum"],
                                                          epsilon=1e-5, domain="com.microsoft"),
                                         17, 4, [None, TensorProto.FLOAT, TensorProto.FLOAT,
                                                 None]),
}


def row_inputs(rng, op_type, dtype, shape=(2, 5, 48)):
    hidden = shape[-1]
    X = (rng.standard_normal(shape) * 2 + 3).astype(dtype)
    col = lambda: rng.standard_normal(hidden).astype(dtype)  # noqa: E731
    if op_type.startswith("Skip"):
        skip = rng.standard_normal(shape).astype(dtype)
        if op_type == "SkipLayerNormalization":
            return [X, skip, col(), col(), col()]
        return [X, skip, col(), col()]
    return [X, col(), col()] if op_type == "LayerNormalization" else [X, col()]


# (the skip operators' schema has no float64)
@pytest.mark.parametrize("op_type,dtype", [
    pytest.param(op, dt, id=f"{op}-{dt.name}") for op in ROW_NODES for dt in (F16, F32, F64)
    if not (op.startswith("Skip") and dt == F64)])
def test_row_normalizations_agree_with_onnxruntime(rng, op_type, dtype):
    node, opset, n_inputs, out_types = ROW_NODES[op_type]
    types = [_ORT_TYPES[dtype] if t is None else t for t in out_types]
    try:
        session, names = ort_session(node, opset, dtype, n_inputs, types)
    except pytest.skip.Exception:
        raise
    except Exception as exc:  # a type onnxruntime has no kernel for
        pytest.skip(f"onnxruntime cannot run {op_type} {dtype}: "
                    f"{str(exc).splitlines()[0][:120]}")
    inputs = row_inputs(rng, op_type, dtype)
    theirs = session.run(None, dict(zip(names, inputs, strict=True)))
    ours = nko.run_node(node, inputs, opset)
    tol = 4e-3 if dtype == F16 else 1e-5
    for a, b in zip(ours, theirs, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol,
                                   atol=tol)


def test_layer_normalization_node_on_a_large_offset_row():
    """InvStdDev of the row 1e4 + [0.1, 0.2, 0.3, 0.4] (float32) is the spec's value
    1 / sqrt(var + 1e-5) = 8.9233 to float32 rounding (onnxruntime 1.32 returned 8.9407:
    a one-pass float32 variance)."""
    node, opset = ROW_NODES["LayerNormalization"][:2]
    X = (1e4 + np.array([[0.1, 0.2, 0.3, 0.4]])).astype(F32)
    s, b = np.ones(4, F32), np.zeros(4, F32)
    y, _, inv = nko.run_node(node, [X, s, b], opset)
    x = X.astype(np.float64)
    exact = 1 / np.sqrt(x.var() + 1e-5)
    np.testing.assert_allclose(inv.ravel()[0], exact, rtol=1e-6)
    np.testing.assert_allclose(y.astype(np.float64), (x - x.mean()) * exact, rtol=1e-5,
                               atol=1e-5)


def test_row_nodes_in_the_evaluator(rng):
    """A model with LayerNormalization, RMSNormalization and a com.microsoft
    SkipLayerNormalization runs in the ReferenceEvaluator with normkernels' OpRuns."""
    X = rng.standard_normal((3, 4, 16)).astype(F32)
    s, b = rng.standard_normal(16).astype(F32), rng.standard_normal(16).astype(F32)
    nodes = [helper.make_node("LayerNormalization", ["x", "s", "b"], ["t"]),
             helper.make_node("RMSNormalization", ["t", "s"], ["u"]),
             helper.make_node("SkipLayerNormalization", ["u", "x", "s", "b"], ["y"],
                              domain="com.microsoft", epsilon=1e-5)]
    info = lambda n, shape: helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)  # noqa: E731
    graph = helper.make_graph(nodes, "g", [info("x", X.shape), info("s", (16,)),
                                           info("b", (16,))], [info("y", X.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23),
                                                    helper.make_opsetid("com.microsoft", 1)])
    (y,) = evaluate(model, {"x": X, "s": s, "b": b})
    t = normkernels.layer_normalization(X, s, b)
    u = normkernels.rms_normalization(t, s)
    np.testing.assert_array_equal(y, normkernels.skip_layer_normalization(u, X, s, b,
                                                                         epsilon=1e-5))


def test_row_node_optional_inputs_and_outputs(rng):
    X = rng.standard_normal((2, 8)).astype(F32)
    s = rng.standard_normal(8).astype(F32)
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "", "inv"])
    y, mean, inv = nko.run_node(node, [X, s])
    assert mean is None and inv.shape == (2, 1) and inv.dtype == F32
    np.testing.assert_array_equal(y, normkernels.layer_normalization(X, s))
    with pytest.raises(ValueError, match="inputs"):
        nko.run_node(node, [X])
    bad = helper.make_node("SkipLayerNormalization", ["x", "k", "s"], ["y"], domain="other")
    with pytest.raises(NotImplementedError, match="SkipLayerNormalization"):
        nko.run_node(bad, [X, X, s])
