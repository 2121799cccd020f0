"""The examples of the README and of the documentation's pages run as written.

Every ```python block of README.md and of the Markdown pages under docs/ (not the
design record, which quotes code rather than examples) runs, the blocks of one page
in order in one namespace. A block that imports an optional package which is not
installed (torch, onnx, dask, transformers, ...) is skipped, and the page is reported
as skipped after its other blocks ran. A block whose first line is ``# not run:
<reason>`` is not run (use it only for what cannot run here, and say why).
"""

import importlib.util
import pathlib
import re
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# docs/design.md is the contributors' record: its snippets are quotes, not examples
NOT_EXAMPLES = {DOCS / "design.md"}
BLOCK = re.compile(r"^(?P<indent>[ ]*)```python[ ]*\n(?P<body>.*?)^(?P=indent)```[ ]*$",
                   re.S | re.M)
IMPORT = re.compile(r"^\s*(?:from|import)\s+([\w.]+)", re.M)
NOT_RUN = "# not run:"
# what an import needs installed, for the packages the base install does not bring
OPTIONAL = {"torch", "onnx", "onnxruntime", "dask", "distributed", "transformers",
            "diffusers", "timm", "matplotlib", "zarr"}
INTEGRATIONS = {"normkernels.torch": "torch", "normkernels.onnx": "onnx",
                "normkernels.dask": "dask"}


def pages():
    guide = sorted(p for p in DOCS.rglob("*.md")
                   if "_build" not in p.parts and p not in NOT_EXAMPLES)
    found = [README, *guide]
    return [p for p in found if "```python" in p.read_text()]


def blocks(path):
    """(first line number, code) of each python block of a page, dedented."""
    text = path.read_text()
    for match in BLOCK.finditer(text):
        indent = match["indent"]
        body = "".join(line[len(indent):] if line.startswith(indent) else line
                       for line in match["body"].splitlines(keepends=True))
        yield text.count("\n", 0, match.start("body")) + 1, textwrap.dedent(body)


def missing_packages(code):
    needed = set()
    for name in IMPORT.findall(code):
        needed |= {INTEGRATIONS[k] for k in INTEGRATIONS if name.startswith(k)}
        if name.split(".")[0] in OPTIONAL:
            needed.add(name.split(".")[0])
    return sorted(n for n in needed if importlib.util.find_spec(n) is None)


def run_page(path):
    """Run a page's blocks in order in one namespace; returns it and the blocks skipped."""
    namespace, skipped = {"__name__": f"docs_example_{path.stem}"}, []
    for line, code in blocks(path):
        if code.lstrip().startswith(NOT_RUN):
            continue
        missing = missing_packages(code)
        if missing:
            skipped.append(f"line {line} (needs {', '.join(missing)})")
            continue
        # blank lines first, so a traceback names the page's own line numbers
        exec(compile("\n" * (line - 1) + code, str(path), "exec"), namespace)
    return namespace, skipped


def test_readme_example_runs():
    code = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]
    namespace = {}
    exec(compile(code, str(README), "exec"), namespace)
    assert namespace["Y"].shape == namespace["X"].shape
    assert namespace["part"].count[0] == namespace["X"].size // 64


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(path):
    _, skipped = run_page(path)
    if skipped:
        pytest.skip(f"{path.relative_to(ROOT)}: the other blocks ran; skipped "
                    + "; ".join(skipped))


def test_every_page_with_examples_is_checked():
    """The README and the guide have examples (a broken pattern would find none)."""
    names = {p.relative_to(ROOT).as_posix() for p in pages()}
    assert {"README.md", "docs/guide/getting-started.md", "docs/guide/rows.md",
            "docs/guide/pytorch.md"} <= names
    assert len(list(blocks(README))) >= 3
