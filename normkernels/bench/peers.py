"""The peers ``normkernels bench`` compares with, each used only when installed.

A peer turns a workload into a zero-argument callable returning Y (dX for a backward
workload; in the workload's layout, so it can be checked against normkernels'), or
raises :class:`Unavailable` with the reason, which the bench prints. Peers:

* ``numpy``: the NumPy formula a user would write (always there).
* ``onnx-ref``: ``onnx.reference.ReferenceEvaluator`` on a one-node model.
* ``onnxruntime``: the same model (IR version 10: onnxruntime 1.31 rejects 14), CPU
  provider, intra-op threads = the bench's, thread spinning off (its idle threads
  otherwise slow down whatever runs next in the process, other candidates included).
* ``torch``: ``torch.nn.functional.batch_norm`` / ``instance_norm`` / ``layer_norm`` /
  ``rms_norm`` / ``group_norm`` / ``local_response_norm`` / ``normalize``; channels-last
  workloads run on a channels_last tensor (no copy), as a PyTorch user would; the
  composites are in :mod:`normkernels.bench.torch_composites`. Backward workloads: the
  ATen backward ops PyTorch's autograd runs, with the forward's saved statistics
  computed before the timed call. Per-sample modulation (AdaLN, AdaGroupNorm): the
  composite a diffusion model writes, ``F.layer_norm`` or ``F.group_norm`` then ``* (1
  + scale) + shift`` per sample, and autograd of it for the backward. LLM serving:
  the skip add, the gate, per-head QK-norm or the int8 quantization around
  ``F.rms_norm`` / ``F.layer_norm``.
* ``openvino``: the one-node model compiled for CPU with f32 inference precision (its
  default on this CPU is bf16). Importing openvino before Numba's first parallel call
  switches Numba to OpenVINO's bundled TBB, so the bench launches a Numba kernel first.

ONNX models take NCHW (onnxruntime's GroupNorm and SkipGroupNorm take X in either layout,
by their channels_last attribute): for channels-last workloads those peers get an NCHW copy made
once, outside the timing, and their Y is moved back for the check. There is no ONNX
operator for a backward pass, so onnx-ref, onnxruntime and openvino skip those.
"""

import numpy as np

from normkernels.bench import torch_composites
from normkernels.operators import BACKWARD, EPSILON, MOMENTUM


class Unavailable(Exception):
    """A peer cannot run this workload (not installed, dtype or op unsupported)."""


def _no_backward(workload, peer):
    """Unavailable for a backward workload: the peers running ONNX models."""
    if workload.mode == BACKWARD:
        raise Unavailable(f"{peer}: no ONNX operator for a backward pass")


def _reason(peer, exc):
    """The informative line of a peer's (often multi-line) error message."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    noise = ("Exception from", "Check '", "Summary", "-- Conversion", "FrontEnd API")
    kept = [ln for ln in lines if not ln.startswith(noise)] or lines or [type(exc).__name__]
    return f"{peer}: {kept[-1][:120]}"


def _ncx(workload, X):
    """X in NCX order (a view)."""
    if workload.data_format == "NXC" and X.ndim > 2:
        return np.moveaxis(X, -1, 1)
    return X


def _back(workload, Y):
    if workload.operator.layout_attribute is not None:
        return Y  # the model took X in its own layout
    if workload.data_format == "NXC" and Y.ndim > 2:
        return np.moveaxis(Y, 1, -1)
    return Y


def numpy_peer(workload, X, params, threads):
    op = workload.operator

    def call():  # float16 overflows in NumPy (instance norm of 512x512): that is its result
        with np.errstate(all="ignore"):
            return op.formula(X, params, workload.mode, workload.channel_axis, X.dtype)
    return call


def onnx_model(workload, X, params):
    """``(model, inputs)``: the workload's operator as a one-node ONNX model and its
    named inputs (X and the parameters)."""
    try:
        from onnx import TensorProto, helper
    except ImportError:
        raise Unavailable("onnx not installed (it builds the one-node model)") from None
    types = {"float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT,
             "float64": TensorProto.DOUBLE, "bfloat16": TensorProto.BFLOAT16}

    def tensor(name, arr):
        return helper.make_tensor_value_info(name, types[np.dtype(arr.dtype).name], arr.shape)

    binding = workload.operator.onnx
    if binding is None:
        raise Unavailable(f"no ONNX operator for {workload.op}")
    _no_backward(workload, "onnx")
    op = workload.operator
    # an operator with a layout attribute (channels_last) takes X as it is
    x = np.ascontiguousarray(X if op.layout_attribute else _ncx(workload, X))
    # an operator normkernels implements takes the node's inputs in its own order
    given = op.arguments(x, params, workload.mode) if binding.implements else [x, *params]
    inputs = dict(zip(binding.inputs, given, strict=False))
    training = workload.mode == "training"
    outputs = ["Y", "running_mean", "running_var"] if training else ["Y"]
    layout = workload.data_format if op.layout_attribute else "NCX"
    attributes = op.kwargs(workload.mode, layout, op.channel_count(x, layout))
    if "groups" in attributes:  # oneDNN's name for ONNX's num_groups
        attributes["num_groups"] = attributes.pop("groups")
    attributes.pop("data_format", None)
    attributes.pop("keep_stats", None)  # oneDNN's, not the ONNX equivalent's
    attributes.pop("rounding", None)  # the fused add's (onnxruntime rounds once)
    if training:  # oneDNN's BatchNormForwardTraining is training by its name
        attributes.setdefault("training_mode", 1)
    node = helper.make_node(binding.op_type, list(inputs), outputs, domain=binding.domain,
                            **attributes)
    y_type = params[0] if workload.op == "rmsnorm" else x  # RMSNormalization: Y is scale's V
    out_info = [tensor("Y", y_type)] + [tensor(n, params[2]) for n in outputs[1:]]
    graph = helper.make_graph([node], workload.name, [tensor(n, a) for n, a in inputs.items()],
                              out_info)
    imports = [helper.make_opsetid("", binding.model_opset)]
    if binding.domain:
        imports.append(helper.make_opsetid(binding.domain, binding.latest))
    model = helper.make_model(graph, opset_imports=imports, ir_version=10)
    return model, inputs


def onnx_reference_peer(workload, X, params, threads):
    _no_backward(workload, "onnx-ref")
    model, inputs = onnx_model(workload, X, params)
    from onnx.reference import ReferenceEvaluator

    try:
        evaluator = ReferenceEvaluator(model)
        with np.errstate(all="ignore"):
            evaluator.run(["Y"], inputs)  # fails where a function body is ill-typed (MVN f16)
    except Exception as exc:  # an operator it has no implementation of (com.microsoft)
        raise Unavailable(_reason("onnx-ref", exc)) from None
    return lambda: _back(workload, evaluator.run(["Y"], inputs)[0])


def _ort_session(workload, X, params, threads):
    """``(session, inputs)``: the one-node model in onnxruntime (CPU provider, the
    bench's intra-op threads, no spinning); a failure to build is Unavailable."""
    _no_backward(workload, "onnxruntime")
    try:
        import onnxruntime as ort
    except ImportError:
        raise Unavailable("onnxruntime not installed") from None
    model, inputs = onnx_model(workload, X, params)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(model.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"]), inputs
    except Exception as exc:
        raise Unavailable(_reason("onnxruntime", exc)) from None


def onnxruntime_peer(workload, X, params, threads):
    session, inputs = _ort_session(workload, X, params, threads)
    try:
        session.run(["Y"], inputs)  # fails for inputs it cannot take (NumPy bfloat16)
    except Exception as exc:
        raise Unavailable(_reason("onnxruntime", exc)) from None
    return lambda: _back(workload, session.run(["Y"], inputs)[0])


def _to_torch(torch, arr):
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def _from_torch(torch, t, dtype):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dtype)
    return t.numpy()


def torch_peer(workload, X, params, threads):
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        raise Unavailable("torch not installed (pip install torch==2.13.0)") from None
    torch.set_num_threads(threads)
    op = workload.operator
    if op.torch is None:
        raise Unavailable("no torch counterpart")
    x = _to_torch(torch, X)
    channels_last = workload.data_format == "NXC" and X.ndim > 2
    if channels_last:
        x = x.movedim(-1, 1)  # NCHW logically, channels_last in memory: no copy
    p = [_to_torch(torch, np.asarray(v)) for v in params]
    if workload.mode == BACKWARD and channels_last:
        p[0] = p[0].movedim(-1, 1)  # dY, as X
    if op.per_sample:
        run = torch_composites.modulated(torch, F, op, x, p, workload.mode == BACKWARD)
    elif workload.mode == BACKWARD:
        run = torch_composites.backward(torch, op, x, p)
        if run is None:
            raise Unavailable(f"torch: no backward op for {op.name}")
    elif op.rows:
        run = torch_composites.rows(torch, F, op, x, p)
    elif op.family == "group":
        groups = op.group_count(x.shape[1])
        if p[-1].dtype != x.dtype:
            p = [v.to(x.dtype) for v in p]  # torch: one dtype
        if op.skip and channels_last:
            p[0] = p[0].movedim(-1, 1)  # skip, as X
        skip = p.pop(0) if op.skip else None

        def run():  # the unfused composite a torch user writes
            with torch.no_grad():
                y = F.group_norm(x if skip is None else x + skip, groups, weight=p[0],
                                 bias=p[1], eps=EPSILON)
                return F.silu(y) if op.epilogue == "silu" else y
    elif op.torch == "local_response_norm":
        kwargs = op.mode_kwargs["inference"]

        def run():
            with torch.no_grad():
                return F.local_response_norm(x, kwargs["size"], alpha=kwargs.get("alpha", 1e-4),
                                             beta=kwargs.get("beta", 0.75),
                                             k=kwargs.get("bias", 1.0))
    elif op.torch == "instance_norm":
        def run():
            with torch.no_grad():
                y = F.instance_norm(x, weight=p[0], bias=p[1], eps=EPSILON)
            return y
    else:
        training = workload.mode == "training"
        if X.ndim > 1 and p[0].dtype != x.dtype and x.dtype != torch.float32:
            p = [v.to(torch.float32) for v in p]  # torch: 16-bit X takes float parameters
        rm, rv = p[2].clone(), p[3].clone()

        def run():
            with torch.no_grad():
                return F.batch_norm(x, rm, rv, weight=p[0], bias=p[1], training=training,
                                    momentum=1 - MOMENTUM, eps=EPSILON)

    def call():
        y = run()
        if op.quantized:  # (q, scales)
            return tuple(t.numpy() for t in y)
        if channels_last:
            y = y.movedim(1, -1)
        return _from_torch(torch, y, X.dtype)

    try:
        call()
    except Exception as exc:
        raise Unavailable(_reason("torch", exc)) from None
    return call


def openvino_peer(workload, X, params, threads):
    _no_backward(workload, "openvino")
    try:
        import openvino as ov
    except ImportError:
        raise Unavailable("openvino not installed") from None
    if "bfloat16" in (X.dtype.name, *(np.asarray(p).dtype.name for p in params[:1])):
        # its Python API hands bf16 tensors over as float16 arrays; the results of a
        # bf16 model disagreed with every other implementation, so they are not shown
        raise Unavailable("bfloat16 not compared (OpenVINO's Python API exposes bf16 "
                          "tensors as float16)")
    model, inputs = onnx_model(workload, X, params)
    core = ov.Core()
    try:
        compiled = core.compile_model(core.read_model(model.SerializeToString()), "CPU",
                                      {"INFERENCE_PRECISION_HINT": "f32",
                                       "INFERENCE_NUM_THREADS": threads})
    except Exception as exc:
        raise Unavailable(_reason("openvino", exc)) from None
    request = compiled.create_infer_request()
    feeds = list(inputs.values())

    def call():  # inputs and outputs shared with NumPy, not copied
        request.infer(feeds, share_inputs=True, share_outputs=True)
        return _back(workload, request.get_output_tensor(0).data)
    return call


PEERS = {"numpy": numpy_peer, "onnx-ref": onnx_reference_peer, "onnxruntime": onnxruntime_peer,
         "torch": torch_peer, "openvino": openvino_peer}


def onnxruntime_bound_peer(workload, X, params, threads, out=None, out_for=None):
    """onnxruntime with its inputs and Y bound once (io-binding, as an engine runs it:
    no per-call allocation or copy); Y lands in ``out`` (of the model's NCX shape)
    when given, else in ``out_for(x)`` (a buffer like the model's input ``x``) when
    that is given. The callable returns Y in the workload's layout."""
    session, inputs = _ort_session(workload, X, params, threads)
    x = inputs[workload.operator.onnx.inputs[0]]
    if out is None:
        out = np.empty(x.shape, x.dtype) if out_for is None else out_for(x)
    Y = out
    try:
        binding = session.io_binding()
        for name, arr in inputs.items():
            binding.bind_cpu_input(name, arr)
        kept = [Y]
        for info in session.get_outputs():
            buf = Y if info.name == "Y" else np.empty(params[2].shape, params[2].dtype)
            kept.append(buf)
            binding.bind_output(info.name, "cpu", 0, buf.dtype, buf.shape, buf.ctypes.data)
        session.run_with_iobinding(binding)
    except Exception as exc:
        raise Unavailable(_reason("onnxruntime", exc)) from None

    def call():
        session.run_with_iobinding(binding)
        return _back(workload, kept[0])
    return call
