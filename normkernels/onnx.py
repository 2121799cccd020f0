"""ONNX integration: run BatchNormalization and InstanceNormalization nodes, and plug
into ``onnx.reference.ReferenceEvaluator``.

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
the spec, these follow the spec (see the README).
"""

import functools
import importlib

import numpy as np

from normkernels import api
from normkernels.operators import onnx_implemented

_OPERATORS = onnx_implemented()  # op_type -> record of normkernels.operators
SUPPORTED = tuple(_OPERATORS)
_DOMAINS = ("", "ai.onnx")
LATEST_OPSET = {op_type: op.onnx.latest for op_type, op in _OPERATORS.items()}


def _attributes(node):
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _check_node(node):
    if node.domain not in _DOMAINS:
        raise NotImplementedError(f"normkernels.onnx: domain {node.domain!r} of node "
                                  f"{node.name or node.op_type!r} is not supported (only the "
                                  "default ONNX domain)")
    if node.op_type not in SUPPORTED:
        raise NotImplementedError(f"normkernels.onnx: operator {node.op_type!r} is not "
                                  f"supported (supported: {', '.join(SUPPORTED)})")


def _requested(node):
    """How many outputs the node declares, trailing empty names dropped (an empty name
    is an optional output nobody wants)."""
    names = list(node.output)
    while names and not names[-1]:
        names.pop()
    return len(names)


def run_node(node, inputs, opset=None):
    """Run one BatchNormalization or InstanceNormalization node.

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
    """
    _check_node(node)
    if opset is None:
        opset = LATEST_OPSET[node.op_type]
    attrs = _attributes(node)
    inputs = list(inputs)
    wanted = [bool(name) for name in node.output]
    op = _OPERATORS[node.op_type]
    names = op.onnx.inputs
    if len(inputs) != len(names):
        raise ValueError(f"{node.op_type}: expected {len(names)} inputs ({', '.join(names)}), "
                         f"got {len(inputs)}")
    spec = importlib.import_module(f"normkernels.ops.{op.spec}")
    if spec.version_for(opset).counts_outputs:  # opsets 1-9: the node's outputs count
        attrs = dict(attrs, num_outputs=max(1, _requested(node)))
    result = getattr(api, op.function)(*inputs, opset=opset, **attrs)
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
    """OpRun classes (one per ONNX operator of :data:`SUPPORTED`) for
    ``onnx.reference.ReferenceEvaluator(model, new_ops=reference_ops())``. They run
    each node with :func:`run_node` at the model's opset."""
    from onnx.reference.op_run import OpRun

    def _run(self, *inputs, **_ignored):
        # attributes come from the node and the schema of the model's opset, not from
        # the evaluator's defaults (those of the latest schema)
        _check_node(self.onnx_node)
        results = run_node(self.onnx_node, inputs, _model_opset(self))
        return tuple(np.empty(0, inputs[0].dtype) if r is None else r for r in results)

    namespace = {"op_domain": "", "_run": _run, "__module__": __name__}
    return [type(op_type, (OpRun,), dict(namespace)) for op_type in SUPPORTED]
