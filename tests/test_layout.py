"""The package's layout (CONTRIBUTING "Layout"): the core, the integrations on it and
the tools on both; imports point one way and never in a circle. Read from the source
with ``ast`` (module-level imports and those inside functions alike), so nothing is
imported to check it."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "normkernels"
INTEGRATIONS = {"normkernels.onnx", "normkernels.dask"}
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


def _imports(module, path):
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1],
                                 *([base] if base else [])])
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
