"""Every public name of normkernels, normkernels.torch, normkernels.onnx, normkernels.dask
and normkernels.numba (each module's ``__all__``) has a numpydoc docstring with its
Parameters, Returns (a function that returns something) and an Examples section whose
doctest runs and prints what it shows. The documentation site renders the same
docstrings (docs/_ext/normkernels_docs.py), so its examples cannot drift."""

import ast
import doctest
import importlib
import inspect
import textwrap

import numpy as np
import pytest

MODULES = {"normkernels": None, "normkernels.torch": "torch", "normkernels.onnx": "onnx",
           "normkernels.dask": "dask", "normkernels.numba": None}


def _public():
    for modname, needs in MODULES.items():
        if needs is not None and importlib.util.find_spec(needs) is None:
            continue
        module = importlib.import_module(modname)
        for name in module.__all__:
            yield pytest.param(modname, name, id=f"{modname}.{name}")


def _sections(doc):
    """The numpydoc section titles of a docstring."""
    lines = inspect.cleandoc(doc).splitlines()
    return {lines[i].strip() for i in range(len(lines) - 1)
            if lines[i + 1].strip() and set(lines[i + 1].strip()) == {"-"}}


def _returns_a_value(fn):
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return any(isinstance(node, ast.Return) and node.value is not None
               for node in ast.walk(tree.body[0]))


@pytest.mark.parametrize(("modname", "name"), list(_public()))
def test_docstring_sections_and_example(modname, name):
    obj = getattr(importlib.import_module(modname), name)
    doc = inspect.getdoc(obj)
    assert doc, f"{modname}.{name} has no docstring"
    sections = _sections(doc)
    assert "Examples" in sections, f"{modname}.{name}: no Examples section"
    if not inspect.isclass(obj):
        fn = getattr(obj, "py_func", obj)  # a Numba dispatcher's Python function
        if inspect.signature(fn).parameters:
            assert "Parameters" in sections, f"{modname}.{name}: no Parameters section"
        if _returns_a_value(fn):
            assert "Returns" in sections, f"{modname}.{name}: no Returns section"
    finder = doctest.DocTestFinder(recurse=False)
    globs = {"np": np, "normkernels": importlib.import_module("normkernels")}
    tests = [t for t in finder.find(obj, f"{modname}.{name}", globs=globs) if t.examples]
    assert tests, f"{modname}.{name}: its Examples section has no doctest (>>>)"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    with np.printoptions(precision=4, suppress=True, legacy=False):
        for t in tests:
            runner.run(t)
    assert runner.failures == 0, f"{modname}.{name}: {runner.failures} example(s) failed"
