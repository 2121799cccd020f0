"""``normkernels bench --suite networks``: the normalization layers of whole networks,
back to back, as an inference engine calls them.

Every layer of a network has its own preallocated X and parameters; the layers of one
shape share their Y (nothing is allocated per call). One pass calls every layer once,
in network order; a candidate's time is the median pass. The candidates run
interleaved in one process: normkernels' plain call (``out=`` given), ``bind`` (each
layer bound once), onnxruntime with io-binding (inputs bound once, Y bound to the
shared buffer of its shape), torch's ``F.*`` functions under ``no_grad`` (they
allocate Y, as a torch user's do) and the NumPy formula.

Why Y is shared: an engine's memory plan reuses an output buffer once its value is
dead, and torch's allocator hands the block it freed back to the next Y of the same
size, so a network's Y is written into memory that is already in cache. A Y of its
own per layer made every write go to DRAM (a read for ownership, then the write
back): at BERT-base batch 8 that was 0.22 ms a layer against 0.15 with the buffer
shared, a cost the torch peer beside it never paid (docs/design.md).

Channels-last networks give the ONNX peers an NCHW copy made outside the timing.
Every candidate's Y of every layer is checked against normkernels' before timing.

An in-place operator (vLLM's ``fused_add_rms_norm``: the ``-fused`` networks) is called
as a serving loop calls it: each candidate has its own copies of every layer's written
arrays (X and the residual, made once), the plain call and ``bind`` write theirs in
place every pass, and the peers (torch's composite, onnxruntime's
SkipSimplifiedLayerNormalization with io-binding, NumPy) read theirs and return Y. The
check calls each candidate once from the same arrays and compares what it writes with
normkernels' (see :func:`_in_place_check`).

The layers are counted from the published architectures (a 224x224 image, sequence
128, a 64x64 latent): see :data:`NETWORKS`.
"""

import json
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from normkernels.bench import peers as peer_module
from normkernels.bench import workloads
from normkernels.bench.report import progress
from normkernels.operators import operator

CANDIDATES = ("normkernels", "bind")
PEERS = ("onnxruntime", "torch", "numpy")  # the peers a pass is timed beside
BUDGET_SECONDS = 20.0  # per network: fewer repeats where a peer's pass takes seconds


@dataclass(frozen=True)
class Network:
    name: str
    title: str
    op: str  # the record of the operator table
    layout: str  # "NCX" or "NXC"
    shapes: tuple  # each layer's X in NCX order, in network order

    @property
    def in_place(self):
        """Its operator writes its inputs (see :func:`_in_place_layer`)."""
        return bool(operator(self.op).in_place)

    def workloads(self):
        return [workloads.custom_workload(self.op, "inference", s, "float32", self.layout)
                for s in self.shapes]


def resnet50(batch):
    """The 53 BatchNorms of torchvision's ResNet-50 (v1.5: the stride on the 3x3)."""
    shapes = [(batch, 64, 112, 112)]
    size, width = 56, 64
    for stage, blocks in enumerate((3, 4, 6, 3)):
        for block in range(blocks):
            first = size * 2 if stage and not block else size  # conv1 before the stride
            shapes += [(batch, width, first, first), (batch, width, size, size),
                       (batch, 4 * width, size, size)]
            if not block:
                shapes.append((batch, 4 * width, size, size))  # the downsample branch
        size, width = size // 2, width * 2
    return tuple(shapes)


def sd15_unet(latent=64):
    """The GroupNorms (32 groups) of the Stable Diffusion 1.5 UNet at a ``latent``
    square: two per ResNet block (its input, its output), one before each spatial
    transformer, and the output norm; up blocks take the concatenated skips."""
    widths, attention = (320, 640, 1280, 1280), (True, True, True, False)
    shapes, skips, size = [], [320], latent

    def resnet(c_in, c_out):
        shapes.extend([(1, c_in, size, size), (1, c_out, size, size)])

    channels = 320
    for level, width in enumerate(widths):
        for _ in range(2):
            resnet(channels, width)
            channels = width
            if attention[level]:
                shapes.append((1, width, size, size))
            skips.append(width)
        if level < 3:
            size //= 2
            skips.append(width)
    resnet(channels, channels)
    shapes.append((1, channels, size, size))
    resnet(channels, channels)
    for level, width in reversed(list(enumerate(widths))):
        for _ in range(3):
            resnet(channels + skips.pop(), width)
            channels = width
            if attention[level]:
                shapes.append((1, width, size, size))
        if level:
            size *= 2
    shapes.append((1, channels, size, size))  # conv_norm_out
    return tuple(shapes)


def _rows(count, shape):
    return (tuple(shape),) * count


NETWORKS = {n.name: n for n in (
    Network("resnet50-b1-ncx", "ResNet-50 batch 1, NCX (53 BN)", "batchnorm", "NCX",
            resnet50(1)),
    Network("resnet50-b1-nxc", "ResNet-50 batch 1, NXC (53 BN)", "batchnorm", "NXC",
            resnet50(1)),
    Network("resnet50-b32-ncx", "ResNet-50 batch 32, NCX (53 BN)", "batchnorm", "NCX",
            resnet50(32)),
    Network("resnet50-b32-nxc", "ResNet-50 batch 32, NXC (53 BN)", "batchnorm", "NXC",
            resnet50(32)),
    Network("bert-b1", "BERT-base batch 1, seq 128 (25 LN of 768)", "layernorm", "NCX",
            _rows(25, (1, 128, 768))),
    Network("bert-b8", "BERT-base batch 8, seq 128 (25 LN of 768)", "layernorm", "NCX",
            _rows(25, (8, 128, 768))),
    Network("llama-decode", "Llama-7B decode step (65 RMSNorm of (1, 4096))", "rmsnorm",
            "NCX", _rows(65, (1, 4096))),
    Network("llama-prefill", "Llama-7B prefill of 512 (65 RMSNorm of (512, 4096))",
            "rmsnorm", "NCX", _rows(65, (512, 4096))),
    Network("llama-decode-fused", "Llama-7B decode step, vLLM's fused add + RMSNorm (65 of "
            "(1, 4096))", "fused-add-rmsnorm", "NCX", _rows(65, (1, 4096))),
    Network("llama-prefill-fused", "Llama-7B prefill of 512, vLLM's fused add + RMSNorm (65 "
            "of (512, 4096))", "fused-add-rmsnorm", "NCX", _rows(65, (512, 4096))),
    Network("vit-b16", "ViT-B/16 (25 LN of (1, 197, 768))", "layernorm", "NCX",
            _rows(25, (1, 197, 768))),
    Network("sd15-unet", "SD-1.5 UNet, 64x64 latent (61 GroupNorm, 32 groups)", "groupnorm",
            "NXC", sd15_unet(64)),
)}


def layer_calls(network, peers, threads):
    """``(calls, skipped, checked)``: {candidate: [one call per layer]}, {peer: reason}
    for the peers that cannot run a layer, and the largest relative difference of each
    candidate's Y from normkernels' over the layers (an in-place record's: of what it
    writes, see :func:`_in_place_layer`)."""
    layer = _in_place_layer if network.in_place else _layer
    calls = {name: [] for name in (*CANDIDATES, *peers)}
    skipped, checked, shared = {}, {}, {}
    for workload in network.workloads():
        running = [name for name in peers if name not in skipped]
        made, errors = layer(workload, running, threads, skipped, shared)
        for name, call in made.items():
            calls[name].append(call)
        for name, error in errors.items():
            checked[name] = max(checked.get(name, 0.0), error)
    for name in skipped:
        del calls[name]
    return calls, skipped, checked


def shared_output(shared, like):
    """The Y buffer of ``like``'s shape, dtype and strides that the layers of a pass
    share (made by the first layer that asks)."""
    key = (like.shape, like.dtype.str, like.strides)
    if key not in shared:
        shared[key] = np.empty_like(like)
    return shared[key]


def _peer_calls(workload, X, params, peers, threads, skipped, shared=None):
    """{peer: call} of one layer (onnxruntime with io-binding, into its own shared Y of
    the shape when ``shared`` is given); a peer that cannot run it goes into ``skipped``
    with the reason."""
    made = {}
    for name in peers:
        try:
            if name == "onnxruntime":
                made[name] = peer_module.onnxruntime_bound_peer(
                    workload, X, params, threads,
                    out_for=None if shared is None else
                    (lambda y: shared_output(shared.setdefault("onnxruntime", {}), y)))
            else:
                made[name] = peer_module.PEERS[name](workload, X, params, threads)
        except peer_module.Unavailable as exc:
            skipped[name] = str(exc)
    return made


def _bound_arguments(workload, X, params):
    """``(function, args, kwargs)`` of the workload's inference call (no ``out``)."""
    import normkernels as nk

    record = workload.operator
    kwargs = record.kwargs("inference", workload.data_format,
                           record.channel_count(X, workload.data_format))
    function = getattr(nk, record.target("inference")[0])
    return function, record.arguments(X, params, "inference"), kwargs


def _layer(workload, peers, threads, skipped, shared):
    """``({candidate: call}, {candidate: max relative difference of its Y from
    normkernels'})`` of one layer: the plain call and ``bind`` write the Y that the
    layers of X's shape share (``shared``: {candidate: {key: buffer}}; onnxruntime
    has its own)."""
    import normkernels as nk

    X, params = workloads.make_inputs(workload)
    out = shared_output(shared.setdefault("normkernels", {}), X)
    function, args, kwargs = _bound_arguments(workload, X, params)
    made = {"normkernels": workloads.normkernels_call(workload, X, params, out),
            "bind": nk.bind(function, *args, out=out, **kwargs),
            **_peer_calls(workload, X, params, peers, threads, skipped, shared)}
    expected = made["normkernels"]().copy()  # bind writes the same out
    return made, {name: workloads.max_relative_error(call(), expected)
                  for name, call in made.items() if name != "normkernels"}


def _private(workload, X, params):
    """``(X, params, written)``: the layer's inputs with every array the in-place call
    writes replaced by a copy of its own (made once), and those copies, Y first."""
    record = workload.operator
    written = record.written(record.arguments(X, params, "inference"), "inference")
    copies = {id(a): a.copy() for a in written}
    x, *rest = (copies.get(id(a), a) for a in (X, *params))
    return x, tuple(rest), tuple(copies[id(a)] for a in written)


def _in_place_layer(workload, peers, threads, skipped, shared=None):
    """:func:`_layer` for an in-place record (vLLM's ``fused_add_rms_norm``): every
    candidate gets its own copies of the arrays the call writes (X and the residual),
    the plain call and ``bind`` write theirs in place (no ``out``), the peers read
    theirs (see :func:`_in_place_check`)."""
    import normkernels as nk

    X, params = workloads.make_inputs(workload)  # the originals: no candidate writes them
    made, owned = {}, {}
    for name in ("normkernels", "bind", *peers):
        x, p, owned[name] = _private(workload, X, params)
        if name in CANDIDATES:
            function, args, kwargs = _bound_arguments(workload, x, p)
            made[name] = (nk.bind(function, *args, **kwargs) if name == "bind"
                          else _plain(function, args, kwargs))
        else:
            made.update(_peer_calls(workload, x, p, (name,), threads, skipped))
    record = workload.operator
    originals = record.written(record.arguments(X, params, "inference"), "inference")
    return made, _in_place_check(made, owned, originals)


def _in_place_check(made, owned, originals):
    """{candidate: max relative difference from normkernels'} after one call of each
    from the same arrays (every copy reset from ``originals`` first): ``bind``'s X and
    residual against the plain call's, a peer's Y against its X (a peer does not write
    the residual)."""
    for copies in owned.values():
        for copy, original in zip(copies, originals, strict=True):
            copy[...] = original
    # a copy: a candidate writing the plain call's arrays would change them too
    expected = [a.copy() for a in _written(made["normkernels"], owned["normkernels"])]
    return {name: max(workloads.max_relative_error(a, b)
                      for a, b in zip(_written(call, owned[name]), expected, strict=False))
            for name, call in made.items() if name != "normkernels"}


def _plain(function, args, kwargs):
    return lambda: function(*args, **kwargs)


def _written(call, copies):
    """What one call of a candidate writes: its copies (in place: the call returns
    None), else the peer's Y."""
    result = call()
    return copies if result is None else (result,)


def time_network(network, peers=PEERS, threads=2, repeat=20, warmup=2,
                 budget_seconds=BUDGET_SECONDS):
    """Median milliseconds per pass of each candidate, the peers it skipped and the
    agreement check (see :func:`layer_calls`)."""
    calls, skipped, checked = layer_calls(network, peers, threads)
    passes = {name: _pass(layer) for name, layer in calls.items()}
    times = {name: [] for name in passes}
    for _ in range(warmup):
        for run in passes.values():
            run()
    names, start = list(passes), time.perf_counter()
    for r in range(repeat):
        k = r % len(names)  # rotate: the position in a round matters
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            passes[name]()
            times[name].append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_seconds and r >= 2:
            break
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    return {"network": network.name, "title": network.title, "layers": len(network.shapes),
            "ms": ms, "rounds": len(times["normkernels"]), "skipped": skipped,
            "max_relative_difference": checked}


def _pass(layer_calls):
    def run():
        for call in layer_calls:
            call()
    return run


def ratios(result):
    """The fastest peer's time over normkernels' and over bind's (above 1: faster)."""
    ms = result["ms"]
    peer = min((p for p in ms if p not in CANDIDATES), key=ms.get, default=None)
    if peer is None:
        return None, None, None
    return peer, ms[peer] / ms["normkernels"], ms[peer] / ms["bind"]


def table(results, peers):
    """The Markdown table of :func:`time_network` results."""
    columns = [*CANDIDATES, *peers]
    lines = ["| network (layers) | " + " | ".join(columns) +
             " | fastest peer / normkernels | fastest peer / bind |",
             "|---|" + "---:|" * (len(columns) + 2)]
    for r in results:
        cells = [f"{r['ms'][c]:.3g}" if c in r["ms"] else "n/a" for c in columns]
        peer, plain, bound = ratios(r)
        tail = ["n/a", "n/a"] if peer is None else [f"{plain:.2f} ({peer})", f"{bound:.2f}"]
        lines.append(f"| {r['title']} | " + " | ".join(cells + tail) + " |")
    return "\n".join(lines)


def command(args, peers, threads):
    """Run the networks named by ``--network`` (default: all), print the table (ms per
    pass) and write --json / --markdown."""
    names = args.network or list(NETWORKS)
    unknown = [n for n in names if n not in NETWORKS]
    if unknown:
        print(f"normkernels bench: unknown network(s) {', '.join(unknown)} (choose from "
              f"{', '.join(NETWORKS)})", file=sys.stderr)
        return 2
    peers = [p for p in peers if p in PEERS]
    repeat = args.repeat or 20
    print(f"normkernels bench --suite networks: {threads} threads, float32, median ms per "
          f"pass of up to {repeat} interleaved rounds ({BUDGET_SECONDS:.0f} s per network); "
          f"peers: {', '.join(peers) or 'none'}", flush=True)
    results = []
    for i, name in enumerate(names):
        progress(i, len(names), name)
        results.append(time_network(NETWORKS[name], peers, threads, repeat, args.warmup + 1))
    progress(len(names), len(names), "done")
    for r in results:
        for peer, reason in r["skipped"].items():
            print(f"{r['network']}: {peer} skipped: {reason}")
        bad = {p: e for p, e in r["max_relative_difference"].items() if e > 1e-3}
        if bad:
            print(f"{r['network']}: Y differs from normkernels': {bad}")
    text = table(results, peers)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": threads, "peers": peers, "results": results}, f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return 0
