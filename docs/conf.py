"""Sphinx configuration of the normkernels documentation.

Build it (offline, warnings as errors) from the repository's root::

    python -m pip install -e '.[docs]'
    python -m sphinx -W --keep-going -b html docs docs/_build/html

The API and CLI reference pages are generated at build time by
``docs/_ext/normkernels_docs.py`` (from ``__all__``, the operator table and the
argument parser) into ``docs/reference/generated/``.
"""

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import normkernels  # noqa: E402

project = "normkernels"
author = "the normkernels authors"
copyright = "the normkernels authors"
release = version = normkernels.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "numpydoc",
    "myst_parser",
    "normkernels_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = [
    "_build",
    # the sweep's generated tables: included by guide/performance.md, not a page
    "sweep-bn.md",
]
templates_path = []

# Markdown pages (myst-parser): headings get anchors for links like page.md#section
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# API reference: autodoc + numpydoc; the pages listing the names are generated
autosummary_generate = False  # normkernels_docs writes the per-name pages itself
autodoc_typehints = "none"
add_module_names = False
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
# A public name without a docstring (GL08), an undocumented parameter (PR01), a
# missing Returns (RT01) or Examples section (EX01) fails the build; the examples
# themselves run in tests/test_docstrings.py.
numpydoc_validation_checks = {"GL08", "PR01", "RT01", "EX01"}

intersphinx_mapping = {}  # offline: no inventories are fetched

html_theme = "pydata_sphinx_theme"
html_title = f"normkernels {release}"
html_theme_options = {
    "navigation_depth": 2,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_static_path = ["_static"]
html_css_files = ["normkernels.css"]
html_show_sourcelink = False
