"""ONNX integration: run the normalization nodes normkernels implements (every one of
ONNX: BatchNormalization, InstanceNormalization, LayerNormalization, RMSNormalization,
GroupNormalization, MeanVarianceNormalization, LpNormalization, LRN; and onnxruntime's
SimplifiedLayerNormalization, SkipLayerNormalization and SkipSimplifiedLayerNormalization
of the com.microsoft domain), and plug into ``onnx.reference.ReferenceEvaluator``.

Needs the ``onnx`` package (``pip install normkernels[onnx]``), imported only when a
function here runs.

* :func:`run_node` runs one ``onnx.NodeProto`` with the semantics of a model's opset.
* :func:`reference_ops` gives OpRun classes for the evaluator::

      ReferenceEvaluator(model, new_ops=normkernels.onnx.reference_ops())

* :func:`_batchnorm_test_mode`, :func:`_batchnorm_training_mode` and
  :func:`_instancenorm_test_mode` have the signatures and output order of the ONNX
  reference's NumPy helpers of the same names, for code that calls those directly.

Attributes are read from the node and defaulted by the schema of the opset in force
(the evaluator defaults them from the latest schema whatever the model's opset); the
operator versions and their checks are those of :func:`normkernels.batch_normalization`
and :func:`normkernels.instance_normalization`. Where the ONNX reference departs from
the spec, these follow the spec (see the user guide's "Differences from the ONNX reference
implementation", ``docs/guide/onnx-reference.md``).
"""

import functools
import importlib

import numpy as np

import normkernels.api as api
from normkernels.operators import onnx_implemented

__all__ = ["reference_ops", "run_node"]

_OPERATORS = onnx_implemented()  # (domain, op_type) -> record of normkernels.operators
SUPPORTED = tuple(op_type for _, op_type in _OPERATORS)
_DOMAINS = ("", "ai.onnx")
LATEST_OPSET = {op_type: op.onnx.latest for (_, op_type), op in _OPERATORS.items()}


def _attributes(node):
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _record(node):
    """The operator record of a node (NotImplementedError for anything else)."""
    domain = "" if node.domain in _DOMAINS else node.domain
    op = _OPERATORS.get((domain, node.op_type))
    if op is None:
        listed = ", ".join(f"{d}::{t}" if d else t for d, t in _OPERATORS)
        raise NotImplementedError(f"normkernels.onnx: operator {node.op_type!r} of domain "
                                  f"{node.domain!r} (node {node.name or node.op_type!r}) is "
                                  f"not supported (supported: {listed})")
    return op


def _check_node(node):
    _record(node)


def _requested(node):
    """How many outputs the node declares, trailing empty names dropped (an empty name
    is an optional output nobody wants)."""
    names = list(node.output)
    while names and not names[-1]:
        names.pop()
    return len(names)


def run_node(node, inputs, opset=None):
    """Run one node of an operator of :data:`SUPPORTED`.

    Parameters
    ----------
    node : onnx.NodeProto
    inputs : sequence of ndarray
        The node's inputs in order.
    opset : int, optional
        The model's opset import for the default domain (default: the latest this
        package implements); the operator version used is the highest at or below it.

    Returns
    -------
    list
        One entry per output the node declares: an ndarray, or None where the output
        name is empty (an optional output that is not wanted).

    Raises
    ------
    NotImplementedError
        The node's operator is not one of :data:`SUPPORTED` (or not of its domain).
    ValueError
        Too few or too many inputs, a required input None, more outputs declared than
        the operator produces at that opset, or an input or attribute its
        :mod:`normkernels` function refuses.

    Examples
    --------
    >>> from onnx import helper
    >>> import normkernels.onnx
    >>> X = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> node = helper.make_node("LayerNormalization", ["X", "Scale"], ["Y", "", "InvStdDev"])
    >>> Y, mean, inv_std = normkernels.onnx.run_node(node, [X, np.ones(4, np.float32)])
    >>> Y
    array([[-1.3416, -0.4472,  0.4472,  1.3416],
           [-1.3416, -0.4472,  0.4472,  1.3416]], dtype=float32)
    >>> mean is None, inv_std
    (True, array([[0.8944],
                  [0.8944]], dtype=float32))

    At opset 9 a BatchNormalization node's outputs say whether it trains:

    >>> node = helper.make_node("BatchNormalization", ["X", "s", "B", "mean", "var"],
    ...                         ["Y", "running_mean", "running_var"], momentum=0.9)
    >>> X = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    >>> s, B, mean, var = (np.full(3, v, np.float32) for v in (1.0, 0.0, 0.0, 1.0))
    >>> Y, running_mean, running_var = normkernels.onnx.run_node(
    ...     node, [X, s, B, mean, var], opset=9)
    >>> running_mean
    array([0.35, 0.55, 0.75], dtype=float32)
    """
    op = _record(node)
    binding = op.onnx
    if opset is None:
        opset = binding.latest
    attrs = _attributes(node)
    inputs = list(inputs)
    wanted = [bool(name) for name in node.output]
    names = binding.inputs
    required = len(names) if binding.required is None else binding.required
    if not required <= len(inputs) <= len(names):
        count = (f"{len(names)}" if required == len(names) else f"{required} to {len(names)}")
        raise ValueError(f"{node.op_type}: expected {count} inputs ({', '.join(names)}), "
                         f"got {len(inputs)}")
    if any(v is None for v in inputs[:required]):
        raise ValueError(f"{node.op_type}: inputs {', '.join(names[:required])} are required")
    if binding.counts_outputs:  # the node's outputs say how many to compute
        attrs = dict(attrs, num_outputs=max(1, _requested(node)))
    if binding.versioned:
        spec = importlib.import_module(f"normkernels.ops.{op.spec}")
        if spec.version_for(opset).counts_outputs:  # opsets 1-9: the node's outputs count
            attrs = dict(attrs, num_outputs=max(1, _requested(node)))
        attrs["opset"] = opset
    result = getattr(api, op.function)(*inputs, **attrs)
    results = list(result) if isinstance(result, tuple) else [result]
    if len(results) < len(wanted):
        raise ValueError(f"{node.op_type}-{opset}: the node declares {len(wanted)} outputs, "
                         f"this mode produces {len(results)}")
    return [r if w else None for r, w in zip(results, wanted, strict=False)]


# --- drop-ins for the ONNX reference's NumPy helpers ---

def _batchnorm_test_mode(x, s, bias, mean, var, epsilon=1e-5):
    """``onnx.reference.ops.op_batch_normalization._batchnorm_test_mode``: Y of
    inference, in X's dtype."""
    return api.batch_normalization(x, s, bias, mean, var, epsilon=epsilon, opset=15)


def _batchnorm_training_mode(x, s, bias, mean, var, momentum=0.9, epsilon=1e-5):
    """``onnx.reference.ops.op_batch_normalization._batchnorm_training_mode``:
    ``(y, saved_mean, saved_var, running_mean, running_var)`` in X's dtype, saved
    statistics being the batch mean and population variance."""
    y, rm, rv, saved_mean, saved_var = api.batch_normalization(
        x, s, bias, mean, var, epsilon=epsilon, momentum=momentum, opset=9, num_outputs=5)
    return y, saved_mean, saved_var, rm, rv


def _instancenorm_test_mode(x, s, bias, epsilon=1e-5):
    """The InstanceNormalization helper of ONNX's test cases (and
    ``InstanceNormalization._run`` without the tuple): y in x's dtype."""
    return api.instance_normalization(x, s, bias, epsilon=epsilon)


# --- OpRun classes for onnx.reference.ReferenceEvaluator ---

def _model_opset(op):
    opsets = op.run_params.get("opsets") or {}
    for domain in _DOMAINS:
        if opsets.get(domain) is not None:
            return int(opsets[domain])
    return None


@functools.cache
def reference_ops():
    """OpRun classes (one per operator of :data:`SUPPORTED`) for
    ``onnx.reference.ReferenceEvaluator(model, new_ops=reference_ops())``. They run
    each node with :func:`run_node` at the model's opset.

    Returns
    -------
    list of type
        Subclasses of ``onnx.reference.op_run.OpRun``, named after their operators.

    Examples
    --------
    >>> from onnx import TensorProto, helper
    >>> from onnx.reference import ReferenceEvaluator
    >>> import normkernels.onnx
    >>> node = helper.make_node("InstanceNormalization", ["X", "scale", "B"], ["Y"])
    >>> inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
    ...           for name in ("X", "scale", "B")]
    >>> output = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    >>> model = helper.make_model(helper.make_graph([node], "g", inputs, [output]),
    ...                           opset_imports=[helper.make_opsetid("", 22)])
    >>> ops = normkernels.onnx.reference_ops()
    >>> "InstanceNormalization" in [op.__name__ for op in ops]
    True
    >>> feeds = {"X": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    ...          "scale": np.ones(3, np.float32), "B": np.zeros(3, np.float32)}
    >>> (Y,) = ReferenceEvaluator(model, new_ops=ops).run(None, feeds)
    >>> Y[0]
    array([[-1.3416, -0.4472,  0.4472,  1.3416],
           [-1.3416, -0.4472,  0.4472,  1.3416],
           [-1.3416, -0.4472,  0.4472,  1.3416]], dtype=float32)
    >>> np.allclose(Y, ReferenceEvaluator(model).run(None, feeds)[0])
    True
    """
    from onnx.reference.op_run import OpRun

    def _run(self, *inputs, **_ignored):
        # attributes come from the node and the schema of the model's opset, not from
        # the evaluator's defaults (those of the latest schema)
        _check_node(self.onnx_node)
        given = list(inputs)
        while given and given[-1] is None:  # optional inputs left out at the end
            given.pop()
        results = run_node(self.onnx_node, given, _model_opset(self))
        return tuple(np.empty(0, inputs[0].dtype) if r is None else r for r in results)

    return [type(op_type, (OpRun,), {"op_domain": domain, "_run": _run,
                                     "__module__": __name__})
            for domain, op_type in _OPERATORS]
