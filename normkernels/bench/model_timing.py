"""Timings beyond one workload: whole ONNX models under the reference evaluator, the
cold start of a fresh process, and the environment a result was measured in."""

import importlib
import statistics
import time

import numpy as np

from normkernels.bench.workloads import max_relative_error
from normkernels.operators import OPERATORS

LIGHT_MODELS = ("resnet50", "densenet121", "inception_v2", "shufflenet")


def evaluator_timing(model_name="resnet50", repeat=3):
    """Wall time of a light-zoo model under ``onnx.reference.ReferenceEvaluator``, with
    the normkernels ops and without (interleaved, medians), total and in the nodes of
    the ONNX operators normkernels implements. Needs onnx."""
    import os

    import onnx
    from onnx import numpy_helper
    from onnx.backend.test.runner import Runner
    from onnx.reference import ReferenceEvaluator

    from normkernels import onnx as nko

    data = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    model = onnx.load(os.path.join(data, f"light_{model_name}.onnx"))
    initializers = {i.name for i in model.graph.initializer}
    feeds = {x.name: Runner.generate_dummy_data(x, seed=0, name=model_name, random=False)
             for x in model.graph.input if x.name not in initializers}
    expected = numpy_helper.to_array(
        onnx.load_tensor(os.path.join(data, f"light_{model_name}_output_0.pb")))
    node_seconds = {"normkernels": 0.0, "onnx.reference": 0.0}

    def timed(cls, key):
        run = cls._run

        def _run(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return run(self, *args, **kwargs)
            finally:
                node_seconds[key] += time.perf_counter() - t0
        return _run

    ours = []
    for cls in nko.reference_ops():
        ours.append(type(cls.__name__, (cls,), {"_run": timed(cls, "normkernels")}))
    bindings = [op.onnx for op in OPERATORS.values()
                if op.onnx and op.onnx.implements and op.onnx.reference_module]
    modules = [importlib.import_module(f"onnx.reference.ops.{b.reference_module}")
               for b in bindings]
    reference_classes = [c for m in modules for c in vars(m).values()
                         if isinstance(c, type)
                         and c.__name__.startswith(tuple(b.op_type for b in bindings))]
    saved = {c: c.__dict__["_run"] for c in reference_classes if "_run" in c.__dict__}
    rows = {"normkernels": [], "onnx.reference": []}
    errors = {}
    try:
        for c in saved:
            c._run = timed(c, "onnx.reference")
        evaluators = {"normkernels": ReferenceEvaluator(model, new_ops=ours),
                      "onnx.reference": ReferenceEvaluator(model)}
        evaluators["normkernels"].run(None, feeds)  # compile / load the kernels
        for _ in range(repeat):
            for key, evaluator in evaluators.items():
                node_seconds[key] = 0.0
                t0 = time.perf_counter()
                out = evaluator.run(None, feeds)[0]
                rows[key].append((time.perf_counter() - t0, node_seconds[key]))
                errors[key] = max_relative_error(out, expected)
    finally:
        for c, run in saved.items():
            c._run = run
    n_nodes = sum(n.op_type in nko.SUPPORTED for n in model.graph.node)
    return {key: {"model_s": statistics.median(r[0] for r in runs),
                  "norm_nodes_s": statistics.median(r[1] for r in runs),
                  "max_rel_err": errors[key], "norm_nodes": n_nodes}
            for key, runs in rows.items()}


def environment():
    """Where a result was measured: CPU, threads, versions."""
    import platform

    import numba

    from normkernels import __version__

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = {"normkernels": __version__, "numba": numba.__version__, "numpy": np.__version__,
                "python": platform.python_version()}
    for name in ("onnx", "onnxruntime", "torch", "openvino"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            pass
    return {"cpu": cpu, "threads": numba.get_num_threads(),
            "threading_layer": numba.threading_layer(), "versions": versions}


COLD_START_FAMILIES = {f"{op.name} {mode}": op.coldstart_call(mode)
                       for op in OPERATORS.values() for mode in op.modes}


def _fresh_python(code, env):
    import json as _json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env)
    if done.returncode != 0:
        raise RuntimeError(f"a fresh process failed:\n{code}\n{done.stderr}")
    return _json.loads(done.stdout.strip().splitlines()[-1])


def cold_start(shape=(2, 16, 8, 8), dtype="float32", repeat=3, families=None):
    """Seconds of: ``import numba``; ``import normkernels`` and loading its operators
    (which imports numba); and per operator and mode (``families``: their labels;
    default all), in fresh processes: the first call with an empty kernel cache
    (compile), the second call in that process, and the first call with the cache
    warm, ``import normkernels`` included (median of ``repeat`` processes)."""
    import os
    import tempfile

    env = dict(os.environ)
    imports = {"import numba": "import numba",
               "import normkernels + operators": "import normkernels; "
                                                 "normkernels.batch_normalization"}
    result = {}
    for label, stmt in imports.items():
        code = ("import time, json; t = time.perf_counter(); " + stmt +
                "; print(json.dumps(time.perf_counter() - t))")
        result[label] = statistics.median(_fresh_python(code, env) for _ in range(repeat))
    for family, call in COLD_START_FAMILIES.items():
        if families is not None and family not in families:
            continue
        with tempfile.TemporaryDirectory() as cache:
            code = (
                "import time, json, numpy as np, ml_dtypes\n"
                f"X = np.ones({tuple(shape)!r}, {dtype!r})\n"
                "t0 = time.perf_counter()\n"
                "import normkernels as nk\n"
                "t1 = time.perf_counter()\n"
                f"{call}\n"
                "t2 = time.perf_counter()\n"
                f"{call}\n"
                "t3 = time.perf_counter()\n"
                "print(json.dumps([t1 - t0, t2 - t1, t3 - t2]))\n")
            run_env = dict(env, NUMBA_CACHE_DIR=cache)
            _, first, second = _fresh_python(code, run_env)
            result[f"{family}: first call, empty cache"] = first
            result[f"{family}: second call"] = second
            result[f"{family}: import and first call, warm cache"] = statistics.median(
                sum(_fresh_python(code, run_env)[:2]) for _ in range(repeat))
    return result
