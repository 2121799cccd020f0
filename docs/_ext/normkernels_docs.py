"""Generate the reference pages at build time: the API pages from each public
module's ``__all__`` (normkernels' functions grouped by family, in the order of the
operator table), a page of the operator table itself, and the CLI reference from the
argument parser of ``normkernels.bench.cli``.

Nothing here lists a public name: a new function in ``__all__`` (or a new record of
the operator table, or a new subcommand) gets its page at the next build. The pages
are written to ``docs/reference/generated/`` (not in git), and only when their text
changed, so Sphinx's incremental builds still work.
"""

import argparse
import importlib
import inspect
import os
import pathlib

from sphinx.util import logging

LOG = logging.getLogger(__name__)

# The public modules, in the order the reference lists them, with what each needs.
PUBLIC_MODULES = {
    "normkernels": None,
    "normkernels.torch": "torch",
    "normkernels.onnx": "onnx",
    "normkernels.dask": "dask",
    "normkernels.numba": None,
}
# Short section titles for the family modules of normkernels.api (a module not named
# here is titled by the first line of its docstring).
FAMILY_TITLES = {
    "normkernels.api.batch": "Batch normalization and moments",
    "normkernels.api.instance": "Instance normalization",
    "normkernels.api.rows": "Row normalizations",
    "normkernels.api.groups": "Group normalizations and the other ONNX normalizations",
    "normkernels.api.llm": "LLM serving: fused residual add",
    "normkernels.api.gated": "LLM serving: gated RMSNorm and QK-norm",
    "normkernels.api.quantized": "LLM serving: quantized outputs",
    "normkernels.api.onednn": "oneDNN Graph operations",
    "normkernels.api.modulated": "Modulated normalizations of diffusion models",
    "normkernels.api.backward": "Backward passes",
    "normkernels.binding": "Bound calls",
    "normkernels.warm": "Warm-up",
}
GENERATED = "reference/generated"


def public_names(modname):
    """A module's public names: its ``__all__``, else the functions and classes it
    defines whose names do not start with an underscore."""
    module = importlib.import_module(modname)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [name for name, value in vars(module).items()
                 if not name.startswith("_") and (inspect.isroutine(value)
                                                  or inspect.isclass(value))
                 and getattr(value, "__module__", None) == modname]
    return sorted(names)


def _summary(obj):
    """The first paragraph of an object's docstring, on one line."""
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split())


def _title(text, char="="):
    return f"{text}\n{char * len(text)}\n"


def _object_page(modname, name):
    obj = getattr(importlib.import_module(modname), name)
    directive = "autoclass" if inspect.isclass(obj) else "autofunction"
    options = "   :show-inheritance:\n" if inspect.isclass(obj) else ""
    return (f"{_title(f'{modname}.{name}')}\n.. currentmodule:: {modname}\n\n"
            f".. {directive}:: {name}\n{options}")


def _summary_table(modname, names):
    lines = [f".. currentmodule:: {modname}", "", ".. autosummary::", "   :nosignatures:", ""]
    lines += [f"   {name}" for name in names]
    return "\n".join(lines) + "\n"


def _families(names):
    """normkernels' names grouped by the module that defines them (the families of
    ``normkernels.api``), the families in the order the operator table first names
    one of their forward functions, then one of their backward functions, the rest
    after them in alphabetical order."""
    import normkernels
    from normkernels.operators import OPERATORS

    module_of = {name: getattr(normkernels, name).__module__ for name in names}
    order = []
    for field in ("function", "backward"):  # the forward families first
        for op in OPERATORS.values():
            module = module_of.get(getattr(op, field))
            if module is not None and module not in order:
                order.append(module)
    order += sorted(set(module_of.values()) - set(order))
    return [(module, sorted(n for n in names if module_of[n] == module)) for module in order]


def _module_page(modname, names):
    module = importlib.import_module(modname)
    text = [_title(f"``{modname}``"), f".. automodule:: {modname}", "   :no-members:", ""]
    if modname == "normkernels":
        text.append("The functions by family (each family is a module of "
                    "``normkernels.api``; the :doc:`operator table <operators>` has one "
                    "record per operator).\n")
        for family, members in _families(names):
            title = FAMILY_TITLES.get(family) or _summary(importlib.import_module(family))
            text += [_title(title, "-"), _summary_table(modname, members)]
    else:
        del module
        text.append(_summary_table(modname, names))
    text += [".. toctree::", "   :hidden:", ""]
    text += [f"   {modname}.{name}" for name in names]
    return "\n".join(text) + "\n"


def _cell(text):
    return str(text).replace("|", "\\|")


def _operators_page():
    """The operator table, one row per record of ``normkernels.operators.OPERATORS``."""
    from normkernels.operators import OPERATORS

    rows = []
    for op in OPERATORS.values():
        onnx = "-"
        if op.onnx is not None:
            domain = f"{op.onnx.domain}::" if op.onnx.domain else ""
            versions = ", ".join(map(str, op.onnx.versions))
            onnx = f"{domain}{op.onnx.op_type} ({versions})"
            if not op.onnx.implements:
                onnx += ", as a peer"
        functions = f":func:`~normkernels.{op.function}`"
        if op.backward:
            functions += f", :func:`~normkernels.{op.backward}`"
        dask = f":func:`~normkernels.dask.{op.function}`" if op.chunked else "-"
        rows.append([f"``{op.name}``", op.title, functions, op.family, ", ".join(op.modes),
                     ", ".join(op.dtypes), onnx, dask])
    header = ["name", "operator", "functions", "family", "modes", "X dtypes", "ONNX node",
              "Dask"]
    text = [_title("The operator table"),
            "One record per public operator (``normkernels/operators/__init__.py``): the bench, "
            "its peers, ``normkernels warmup`` and ``coldstart``, the ONNX drop-in, the "
            "Dask functions and the benchmark cases iterate it. ``name`` is the key "
            "``normkernels bench --op``, ``warmup --ops`` and ``coldstart --ops`` take.",
            "", ".. list-table::", "   :header-rows: 1", ""]
    for row in [header, *rows]:
        text.append(f"   * - {_cell(row[0])}")
        text += [f"     - {_cell(cell)}" for cell in row[1:]]
    return "\n".join(text) + "\n"


class _Parser(Exception):
    def __init__(self, parser):
        self.parser = parser


def cli_parser():
    """The argument parser ``normkernels.bench.cli.main`` builds (caught before it
    parses anything)."""
    from normkernels.bench import cli

    def capture(parser, *args, **kwargs):
        raise _Parser(parser)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture
    try:
        cli.main([])
    except _Parser as caught:
        return caught.parser
    finally:
        argparse.ArgumentParser.parse_args = original
    raise RuntimeError("normkernels.bench.cli.main returned without parsing arguments")


def _literal(text):
    return "::\n\n" + "\n".join(f"    {line}" if line else "" for line in
                                text.rstrip().splitlines()) + "\n"


def _cli_page():
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"  # argparse wraps to the terminal's width
    try:
        parser = cli_parser()
        subcommands = next(a for a in parser._actions
                           if isinstance(a, argparse._SubParsersAction))
        text = [_title("Command line"),
                "``normkernels`` is installed with the package (``python -m normkernels`` "
                "runs it too). This page is the parser's own help, generated when the "
                "documentation is built.", "", _literal(parser.format_help())]
        for name, sub in subcommands.choices.items():
            text += [_title(f"normkernels {name}", "-"), _literal(sub.format_help())]
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return "\n".join(text)


def _write(path, text, written):
    written.add(path)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def generate(app):
    out = pathlib.Path(app.srcdir) / GENERATED
    out.mkdir(parents=True, exist_ok=True)
    written = set()
    for modname, extra in PUBLIC_MODULES.items():
        try:
            names = public_names(modname)
        except ImportError as error:
            raise RuntimeError(f"the API reference of {modname} needs {extra} installed "
                               f"(pip install -e '.[{extra}]'): {error}") from error
        _write(out / f"{modname}.rst", _module_page(modname, names), written)
        for name in names:
            _write(out / f"{modname}.{name}.rst", _object_page(modname, name), written)
    _write(out / "operators.rst", _operators_page(), written)
    _write(out / "cli.rst", _cli_page(), written)
    for stale in set(out.glob("*.rst")) - written:  # a name that left __all__
        stale.unlink()
    LOG.info("normkernels_docs: %d reference pages in %s", len(written), GENERATED)


def setup(app):
    app.connect("builder-inited", generate, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
