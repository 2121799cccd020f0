"""The package's layout (CONTRIBUTING "Layout"): the core, the integrations on it and
the tools on both; imports point one way and never in a circle; no module uses
another's private (``_``) names; no file is over LINE_LIMIT lines. Read from the
source with ``ast`` (module-level imports and those inside functions alike), so
nothing is imported to check it."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "normkernels"
INTEGRATIONS = {"normkernels.onnx", "normkernels.dask", "normkernels.torch",
                "normkernels.numba"}
TOOLS_PREFIX = "normkernels.bench"
ENTRY = {"normkernels", "normkernels.__main__"}  # lazy names and `python -m normkernels`


def _module(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _known(name):
    """The module ``name`` is, or the module it is an attribute of."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _from_base(node, package):
    """The absolute module name of an ``ImportFrom`` inside ``package``."""
    base = node.module or ""
    if node.level:
        base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1],
                         *([base] if base else [])])
    return base


def _imports(module, path):
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, package)
            # ``from a import b``: b is a submodule or an attribute of a
            names = [_known(f"{base}.{a.name}") or base for a in node.names]
        else:
            continue
        found |= {_known(n) for n in names if n.split(".")[0] == "normkernels"}
    found.discard(module)
    found.discard("")
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _part(module):
    if module.startswith(TOOLS_PREFIX) or module == "normkernels.__main__":
        return "tools"
    if any(module == m or module.startswith(m + ".") for m in INTEGRATIONS):
        return "integrations"
    return "core"


def test_the_graph_is_read():
    """The reader finds the edges it must (so the checks below can fail)."""
    assert "normkernels.ops.common" in GRAPH["normkernels.ops.batch_normalization"]
    assert "normkernels.api" in GRAPH["normkernels.binding"]
    assert GRAPH["normkernels.bench.cli"] & {"normkernels.bench.workloads"}


def test_no_import_cycle():
    """No module reaches itself through the imports of others."""
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = "open"
        for n in sorted(GRAPH.get(m, ())):
            if state.get(n) == "open":
                cycles.append([*stack[stack.index(n):], n])
            elif n not in state:
                visit(n, [*stack, n])
        state[m] = "done"

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


@pytest.mark.parametrize("part,never", [("core", {"integrations", "tools"}),
                                        ("integrations", {"tools"})])
def test_imports_point_from_tools_to_integrations_to_core(part, never):
    upward = sorted((m, n) for m, deps in GRAPH.items() if _part(m) == part and m not in ENTRY
                    for n in deps if _part(n) in never)
    assert not upward, upward



def test_the_spec_layer_does_not_import_the_kernels():
    """ops/ says what to compute; what it needs of the loops goes through the engine."""
    wrong = sorted((m, n) for m, deps in GRAPH.items() if m.startswith("normkernels.ops")
                   for n in deps if n.startswith("normkernels.kernels"))
    assert not wrong, wrong


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_uses(module, source, is_package=False):
    """``(line, what)`` for each name with a leading underscore that ``module`` takes
    from another normkernels module: ``from m import _x``, and ``m._x`` where ``m`` is
    a normkernels module (imported under any name, or as a dotted ``normkernels.a.b``).
    Read from the source as :func:`_imports` reads it (scopes are not told apart)."""
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    bound, found = {}, []  # local name -> the normkernels module it is
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "normkernels":
                    if a.asname:
                        bound[a.asname] = a.name
                    else:
                        bound[a.name.split(".")[0]] = "normkernels"
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, package)
            if base.split(".")[0] != "normkernels":
                continue
            for a in node.names:
                if f"{base}.{a.name}" in MODULES:
                    bound[a.asname or a.name] = f"{base}.{a.name}"
                if _private(a.name) and base != module:
                    found.append((node.lineno, f"from {base} import {a.name}"))

    def dotted(node):  # the module an expression names, or None
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            owner = dotted(node.value)
            if owner and f"{owner}.{node.attr}" in MODULES:
                return f"{owner}.{node.attr}"
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = dotted(node.value)
            if owner and owner != module:
                found.append((node.lineno, f"{owner}.{node.attr}"))
    return sorted(found)


def test_the_private_reader_finds_uses():
    """:func:`_private_uses` sees each form it must (so the check below can fail)."""
    source = ("import normkernels.ops.common as c\nimport normkernels\n"
              "from normkernels.ops import rows\nfrom normkernels.ops.common import _a, b\n"
              "from ..ops import _e\nc._f\nrows._g\nnormkernels.ops.common._h\nself._i\n"
              "rows.__doc__\nc.d\n")
    uses = _private_uses("normkernels.engine.sample", source)
    assert [what for _, what in uses] == [
        "from normkernels.ops.common import _a", "from normkernels.ops import _e",
        "normkernels.ops.common._f", "normkernels.ops.rows._g", "normkernels.ops.common._h"]


def test_no_module_uses_another_modules_private_names():
    """A name with a leading underscore is its module's own: what another module
    needs gets a public name."""
    wrong = [f"{MODULES[m].relative_to(ROOT)}:{line}: {what}" for m in sorted(MODULES)
             for line, what in _private_uses(m, MODULES[m].read_text(),
                                             MODULES[m].name == "__init__.py")]
    assert not wrong, wrong


LINE_LIMIT = 450


def test_no_file_is_over_the_line_limit():
    """A module over LINE_LIMIT lines is split where its parts are cohesive."""
    long = sorted(f"{p.relative_to(ROOT).as_posix()}: {n} lines" for p in MODULES.values()
                  if (n := len(p.read_text().splitlines())) > LINE_LIMIT)
    assert not long, long


def test_every_planted_bug_still_applies():
    """tests/mutations.py's replacements each occur once in their files (so a refactor
    that moves a snippet is caught here, not when someone next runs the mutations)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(ROOT / "tests" / "mutations.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
