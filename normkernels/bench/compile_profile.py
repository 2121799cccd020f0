"""Where a first call's compile time goes: ``normkernels coldstart --profile OP``.

Numba broadcasts an event when a dispatcher compiles (``numba:compile``; a load from
the disk cache is none), when a pipeline pass runs (``numba:run_pass``, with the qualified name of
the function it compiles: a kernel, an inlined helper's overload, a parfor body) and
while LLVM works (``numba:llvm_lock``). Every moment of a call goes to the innermost
of these: to the function the innermost pass compiles, and to a stage of it (LLVM
while the LLVM lock is held, else the pass's stage). A helper that is a dispatcher of
its own shows as its own row; a helper inlined at the Numba-IR level shows in its
caller's inlining and typing; its overload templates, typed apart, show as rows of
their own.

Run as a module (``python -m normkernels.bench.compile_profile LABEL``) it makes the
first call of a ``normkernels coldstart`` row in this process and prints the
profile as JSON; :func:`first_call` runs that in a fresh process with an empty kernel
cache.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

STAGES = ("typing", "inlining", "parfors", "lowering", "LLVM", "other passes", "dispatch")


def stage_of(pass_name):
    """The stage a Numba pass belongs to (its name: ``"nopython_type_inference
    [qualname]"``)."""
    if pass_name is None:
        # in a dispatcher's compile, outside its pipeline: the compiler's set-up (the
        # target context's refresh at a process's first compile); a kernel's save to
        # the disk cache follows its compile event, so it is charged to its caller
        return "dispatch"
    name = pass_name.split(" ")[0]
    if "type_inference" in name:
        return "typing"
    if "lowering" in name or "backend" in name:
        return "lowering" if name != "parfor_prelowering_pass" else "parfors"
    if "parfor" in name:
        return "parfors"
    if "inline" in name:
        return "inlining"
    return "other passes"


def function_of(qualname, module):
    """A row's name: ``module.qualname`` with the package prefix dropped; a parfor's
    gufunc (named ``__numba_parfor_gufunc_<hex>``) goes to one row of parfor bodies."""
    if qualname.startswith("__numba_parfor_gufunc"):
        return "(parfor bodies)"
    module = (module or "").removeprefix("normkernels.")
    return f"{module}.{qualname}" if module else qualname


def _recorder():
    """A Numba event listener keeping (time, kind, is_start, data) in order."""
    from numba.core import event

    class Recorder(event.Listener):
        def __init__(self):
            self.events = []

        def on_start(self, ev):
            self.events.append((time.perf_counter(), ev.kind, True, _data(ev)))

        def on_end(self, ev):
            self.events.append((time.perf_counter(), ev.kind, False, _data(ev)))

    return Recorder()


def _data(ev):
    data = ev.data if isinstance(ev.data, dict) else {}
    if ev.kind == "numba:run_pass":
        return {"name": data.get("name"), "qualname": data.get("qualname", "?"),
                "module": data.get("module")}
    if ev.kind == "numba:compile":
        fn = getattr(data.get("dispatcher"), "py_func", None)
        return {"qualname": getattr(fn, "__qualname__", "?"),
                "module": getattr(fn, "__module__", None)}
    return {}


def attribute(events, start, end):
    """{function: {stage: seconds}} and the number of dispatchers compiled, from the
    recorded ``events`` of a call that ran from ``start`` to ``end`` (a load from the
    disk cache is no event: its time shows as "dispatch" of its caller)."""
    table = {}
    stack = []  # frames: (kind, data)
    compiled = set()
    last = start

    def charge(dt):
        function, stage = "(outside Numba's compiler)", "dispatch"
        llvm = False
        for kind, data in reversed(stack):
            if kind == "numba:llvm_lock":
                llvm = True
            elif kind == "numba:run_pass":
                function = function_of(data["qualname"], data["module"])
                stage = "LLVM" if llvm else stage_of(data["name"])
                break
            elif kind == "numba:compile":
                function = function_of(data["qualname"], data["module"])
                stage = "LLVM" if llvm else "dispatch"
                break
        else:
            if llvm:
                stage = "LLVM"
        row = table.setdefault(function, dict.fromkeys(STAGES, 0.0))
        row[stage] += dt

    for t, kind, is_start, data in events:
        charge(t - last)
        last = t
        if is_start:
            stack.append((kind, data))
            if kind == "numba:compile":
                compiled.add(function_of(data["qualname"], data["module"]))
        else:
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] == kind:
                    del stack[i]
                    break
    charge(end - last)
    return table, len(compiled)


def profile(call):
    """Run ``call()`` with Numba's compile events recorded: a dict with the call's
    ``seconds``, the ``rows`` ``[function, total, {stage: seconds}]`` (largest first),
    the number of dispatchers ``compiled`` and of kernels ``loaded`` from the disk
    cache."""
    from numba.core import event

    recorder = _recorder()
    kinds = ("numba:compile", "numba:run_pass", "numba:llvm_lock")
    for kind in kinds:
        event.register(kind, recorder)
    hits = _cache_hits()
    try:
        start = time.perf_counter()
        call()
        end = time.perf_counter()
    finally:
        for kind in kinds:
            event.unregister(kind, recorder)
    table, compiled = attribute(recorder.events, start, end)
    loaded = _cache_hits() - hits
    rows = sorted(([name, sum(stages.values()), stages] for name, stages in table.items()),
                  key=lambda r: -r[1])
    return {"seconds": end - start, "rows": rows, "compiled": compiled, "loaded": loaded}


def _cache_hits():
    """Loads from the disk cache so far, over the dispatchers of the kernel modules
    imported."""
    from numba.core.dispatcher import Dispatcher

    return sum(sum(obj._cache_hits.values())
               for name, module in list(sys.modules.items())
               if name.startswith("normkernels.kernels.") and module is not None
               for obj in list(vars(module).values()) if isinstance(obj, Dispatcher))


def format_profile(result, limit=25):
    """The profile as a table: one row per function (the ``limit`` largest, then the
    rest summed), a column per stage, and the stages' totals."""
    from normkernels.bench.report import format_table

    rows, rest = result["rows"][:limit], result["rows"][limit:]
    body = [[name, f"{total:.3f}", *(f"{stages[s]:.3f}" for s in STAGES)]
            for name, total, stages in rows]
    if rest:
        body.append([f"({len(rest)} more)", f"{sum(r[1] for r in rest):.3f}",
                     *(f"{sum(r[2][s] for r in rest):.3f}" for s in STAGES)])
    body.append(["all", f"{sum(r[1] for r in result['rows']):.3f}",
                 *(f"{sum(r[2][s] for r in result['rows']):.3f}" for s in STAGES)])
    return format_table(body, ["function (s)", "total", *STAGES])


def first_call(label, shape=(2, 16, 8, 8), dtype="float32"):
    """The profile of the first call of a ``normkernels coldstart`` row (``label``,
    such as ``"layernorm inference"``) in a fresh process with an empty kernel cache,
    ``import normkernels`` not included."""
    from normkernels.bench.model_timing import COLD_START_FAMILIES

    if label not in COLD_START_FAMILIES:
        raise ValueError(f"coldstart --profile: {label!r} is not one of "
                         f"{', '.join(COLD_START_FAMILIES)}")
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        done = subprocess.run([sys.executable, "-m", __name__, label, ",".join(map(str, shape)),
                               dtype], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"coldstart --profile {label}: the child failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def command(names, shape, dtype, limit=25, json_path=None):
    """``normkernels coldstart --profile NAMES``: operators (record names, every mode)
    or coldstart rows ("layernorm backward"), comma-separated; prints each profile."""
    from normkernels.bench.model_timing import COLD_START_FAMILIES

    labels = []
    for name in names.split(","):
        found = [f for f in COLD_START_FAMILIES if f == name or f.split()[0] == name]
        if not found:
            print(f"normkernels coldstart: --profile {name!r} is not an operator or row of "
                  f"{', '.join(COLD_START_FAMILIES)}", file=sys.stderr)
            return 2
        labels += found
    results = {}
    for label in labels:
        result = results[label] = first_call(label, shape, dtype)
        print(f"\n{label}, {'x'.join(map(str, shape))} {dtype}: first call with an empty "
              f"cache {result['seconds']:.2f} s in a fresh process ({result['compiled']} "
              f"functions compiled, {result['loaded']} loaded; seconds by Numba's stage)")
        print(format_profile(result, limit))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def _main(label, shape, dtype):
    import ml_dtypes
    import numpy as np

    import normkernels as nk
    from normkernels.bench.model_timing import COLD_START_FAMILIES

    X = np.ones(tuple(int(v) for v in shape.split(",")), dtype)
    code = compile(COLD_START_FAMILIES[label], "<first call>", "exec")
    scope = {"np": np, "nk": nk, "ml_dtypes": ml_dtypes, "X": X}
    print(json.dumps(profile(lambda: exec(code, scope))))


if __name__ == "__main__":
    _main(*sys.argv[1:4])
