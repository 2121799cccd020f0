"""The numpydoc docstrings of :mod:`normkernels.dask`'s functions, built from the
operator table: a strategy writes the prose of its function and what it returns;
:func:`document` adds the Parameters (from the function's signature: X, the other
inputs, the keyword arguments of the NumPy function and the strategy's own), the
Returns, the Raises and an Examples section whose doctest is generated from the
record (its first call's arguments on a small float32 X, chunked along every axis,
compared with the NumPy function). The documentation test runs every example, so a
record whose example does not run for its own function fails there.

Importing this module does not import dask."""

import inspect
import textwrap

from normkernels import api
from normkernels.operators.record import BACKWARD

# the keyword arguments a strategy adds to the NumPy function's (or documents its own way)
EXTRAS = {
    "split_every": ("int or dict, optional",
                    "The fan-in of dask's tree reduction of the partial statistics "
                    "(``dask.array.reduction``'s)."),
    "compute_statistics": ("bool, default False",
                           "Compute the statistics now (one pass over X) and build the "
                           "result on them: for an X that does not fit in memory and is "
                           "not persisted (in one graph, every block of X would wait in "
                           "memory for the statistics, to be normalized after them)."),
    "out": ("None", "Not supported on dask arrays (a ValueError)."),
}
# what each kind of output of Chunked.outputs is shaped like
OUTPUT_KINDS = {"X": "X's shape",
                "rows": "X's leading axes, the normalized ones kept as length 1",
                "lead": "X's leading axes",
                "channel": "one value per channel",
                "groups": "one value per (sample, group)"}
# an example's parameter values, by the table's names (operators.calls: scale, B, mean, var)
_VALUES = {"scale": "np.linspace(0.5, 2.0, 4, dtype=np.float32)",
           "B": "np.linspace(-1.0, 1.0, 4, dtype=np.float32)",
           "mean": "np.linspace(-2.0, 2.0, 4, dtype=np.float32)",
           "var": "np.linspace(1.0, 4.0, 4, dtype=np.float32)",
           "skip": "np.linspace(-1.0, 1.0, X.size, dtype=np.float32).reshape(X.shape)"}
_PARAMS = ("scale", "B", "mean", "var")
_WIDTH = 88  # an example's lines are wrapped at this width


def document(op, fn, returns, inputs="", arguments=None, refused="", raises=()):
    """Give ``fn`` (the record ``op``'s function on dask arrays, whose docstring is its
    prose) its numpydoc sections and return it. ``returns``: ``(type, description)`` of
    what it returns; ``inputs``: what the inputs after X take besides the NumPy
    function's; ``arguments``: name -> ``(type, description)`` of the keyword arguments
    the strategy documents its own way (else :data:`EXTRAS`'); ``refused``: what else
    raises a ValueError; ``raises``: other ``(exception, description)`` entries."""
    prose = [_fill(p, "") if "\n" not in p and len(p) > _WIDTH else p
             for p in inspect.cleandoc(fn.__doc__ or "").split("\n\n")]
    x = next(iter(inspect.signature(fn).parameters))
    numpy_fn = f":func:`normkernels.{op.function}`"
    errors = [("TypeError", f"``{x}`` is not a dask array."),
              ("ValueError", f"``{x}`` has unknown chunk sizes, or an argument {numpy_fn} "
                             f"refuses (checked when the graph is built){refused}."),
              *raises]
    sections = ["\n\n".join(prose),
                _section("Parameters", parameters(op, fn, inputs, arguments)),
                _section("Returns", _entry([], *returns)),
                _section("Raises", "\n".join(_entry([e], "", t) for e, t in errors)),
                _section("Examples", example(op, fn))]
    fn.__doc__ = "\n\n".join(sections) + "\n"
    return fn


def _fill(text, indent="    "):
    return textwrap.fill(" ".join(text.split()), _WIDTH, initial_indent=indent,
                         subsequent_indent=indent, break_on_hyphens=False)


def _section(title, body):
    return f"{title}\n{'-' * len(title)}\n{body}"


def _entry(names, kind, text):
    """A numpydoc entry: ``names : kind`` (either may be empty) and its description."""
    head = " : ".join(part for part in (", ".join(names), kind) if part)
    return f"{head}\n{_fill(text)}"


def parameters(op, fn, inputs="", arguments=None):
    """The Parameters section's entries of ``fn``: X, the other inputs, the keyword
    arguments of the NumPy function (one entry) and those ``arguments`` or
    :data:`EXTRAS` describe, in the signature's order."""
    own = {**EXTRAS, **(arguments or {})}
    numpy_fn = f":func:`normkernels.{op.function}`"
    names = list(inspect.signature(fn).parameters.values())
    x, rest = names[0].name, names[1:]
    positional = [p.name for p in rest if p.kind is not p.KEYWORD_ONLY]
    keywords = [p.name for p in rest if p.kind is p.KEYWORD_ONLY and p.name not in own]
    extras = [p.name for p in rest if p.kind is p.KEYWORD_ONLY and p.name in own]
    named = "" if x == "X" else " (X below)"
    entries = [_entry([x], "dask.array.Array",
                      f"The input{named}, chunked along any axes (its chunk sizes known).")]
    if positional:
        entries.append(_entry(positional, "ndarray or dask.array.Array",
                              f"As for {numpy_fn}{'; ' + inputs if inputs else ''}."))
    if keywords:
        entries.append(_entry(keywords, "", f"The keyword arguments of {numpy_fn}, with "
                                            f"its defaults."))
    entries += [_entry([name], *own[name]) for name in extras]
    return "\n".join(entries)


def whole_returns(op):
    """The Returns entry of a record's function by the "whole" strategy, from the
    kinds of its outputs (:class:`normkernels.operators.record.Chunked`)."""
    kinds = op.chunked.outputs
    chunked = ("Outputs of X's shape are chunked like X, rechunked along the axes held "
               "whole.")
    if len(kinds) == 1:
        return "dask.array.Array", f"Lazy Y, of X's shape. {chunked}"
    shapes = "; ".join(OUTPUT_KINDS[k] for k in kinds)
    return ("dask.array.Array or tuple of dask.array.Array",
            f"Lazy, what :func:`normkernels.{op.function}` returns for these arguments: Y, "
            f"or the tuple of its outputs, shaped in order: {shapes}. {chunked}")


# --- the example ---

def _mode(op):
    """The mode the example calls: the record's last forward mode (training where it
    has one: the statistics merged across chunks)."""
    return [m for m in op.modes if m != BACKWARD][-1]


def _shape(op):
    """X's shape (C = 4 channels, or rows of 4) in the record's layout."""
    if op.rows:
        return (2, 3, 4)
    return (2, 2, 3, 4) if op.default_layout == "NXC" else (2, 4, 2, 3)


def _wrap(head, args, tail=")"):
    """``head + ", ".join(args) + tail`` as doctest lines of at most :data:`_WIDTH`
    characters where the arguments allow (continuations aligned after ``head``)."""
    lines, line, empty = [], ">>> " + head, True
    for i, arg in enumerate(args):
        piece = arg + (", " if i < len(args) - 1 else tail)
        if not empty and len(line) + len(piece.rstrip()) > _WIDTH:
            lines.append(line.rstrip())
            line = "... " + " " * len(head)
        line, empty = line + piece, False
    return [*lines, line]


def _default(parameters, name):
    parameters = getattr(parameters, "parameters", parameters)
    return parameters[name].default if name in parameters else inspect.Parameter.empty


def example(op, fn):
    """A doctest of ``fn``, the record ``op``'s function on dask arrays: the record's
    call (:meth:`normkernels.operators.Operator.arguments` and ``kwargs``) of its
    last forward mode on a float32 X with 4 channels (or rows of 4) chunked in halves
    along every axis, computed and compared with the NumPy function."""
    mode, shape = _mode(op), _shape(op)
    signature = inspect.signature(fn)
    table = ("skip",) * op.skip + _PARAMS[:op.n_params]
    order = op.arguments("X", table, mode)  # the table's names in the function's order
    names = dict(zip(order[1:], list(signature.parameters)[1:len(order)], strict=True))
    kwargs = op.kwargs(mode, op.default_layout, shape[-1] if op.rows else 4)
    if op.groups is not None:  # two groups of two channels
        kwargs[op.groups[0]] = 2
    numpy_defaults = inspect.signature(getattr(api, op.function)).parameters
    kwargs = {k: v for k, v in kwargs.items()  # those of both functions' defaults left out
              if not (_default(signature, k) == _default(numpy_defaults, k) == v)}
    size = 1
    for s in shape:
        size *= s
    chunks = tuple(max(1, s // 2) for s in shape)
    lines = ["import dask.array as da", "import normkernels.dask",
             f"X = np.arange({size}, dtype=np.float32).reshape{shape}"]
    lines += [f"{names[t]} = {_VALUES[t]}" for t in table]
    lines.append(f"lazy_X = da.from_array(X, chunks={chunks})")
    if op.skip:
        lines.append(f"lazy_{names['skip']} = da.from_array({names['skip']}, chunks={chunks})")
    lazy_args = ["lazy_X"] + [f"lazy_{names[t]}" if t == "skip" else names[t] for t in order[1:]]
    args = ["X"] + [names[t] for t in order[1:]]
    keywords = [f"{k}={v!r}" for k, v in kwargs.items()]
    single = not (op.reads_only or mode == "training")
    out = ["Y" if single else "lazy", "expected"]
    text = [f">>> {line}" for line in lines]
    text += _wrap(f"{out[0]} = normkernels.dask.{op.function}(", lazy_args + keywords)
    text += _wrap(f"{out[1]} = normkernels.{op.function}(", args + keywords)
    if single:
        text += [">>> np.allclose(Y.compute(), expected)", "True"]
    else:
        text += [">>> all(np.allclose(a.compute(), b) for a, b in zip(lazy, expected, "
                 "strict=True))", "True"]
    return "\n".join(text)
