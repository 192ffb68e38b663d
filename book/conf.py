"""Sphinx configuration of the book's website (built by book/build.py: `make book`).

The pages are gathered by book/build.py into build/book/src; this file says how they are read
(myst-nb over the executed notebooks, never re-executing them) and adds the two things specific
to this book: the "Read the real thing" headings become links to the source pages, and a widget
(whose state the notebooks do not keep) is replaced by one line saying where it runs.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from docutils import nodes
from sphinx.util import logging

project = "minicb: how LLM servers keep a GPU busy"
author = "the minicb authors"
copyright = "the minicb authors, MIT licence"

extensions = ["myst_nb"]
exclude_patterns = ["downloads/**", "**/.ipynb_checkpoints"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

# the committed notebooks are the outputs: never run them here
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["colon_fence", "dollarmath", "html_image"]
myst_heading_anchors = 3
# Source listings carry their line numbers inside the code block (as in the notebook), so a C
# preprocessor line reads "78  #pragma ...", which Pygments' C lexer cannot place; it falls back
# to relaxed highlighting, which renders the listing correctly. Nothing else is suppressed.
suppress_warnings: list[str] = ["misc.highlighting_failure"]

html_theme = "sphinx_book_theme"
html_title = "minicb"
html_static_path = ["_static"]
html_favicon = "_static/favicon.svg"
html_css_files = ["book.css"]
html_js_files = ["source-lines.js"]
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": False,       # each chapter links its notebook itself
    "use_fullscreen_button": False,
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
}
# light: the recorded figures are drawn on white (an empty mode is a console error)
html_context = {"default_mode": "light"}
html_last_updated_fmt = None
# the source pages (book/build.py) have no sidebar: the listing gets the width, and the
# chapters' table of contents is not rendered again for each of them
html_sidebars = {"source/**": []}
html_show_sourcelink = False

SHOWN_SOURCE = re.compile(r"((?:minicb|kernels)/[\w/.-]+\.(?:py|c|h)), lines (\d+)-(\d+)")
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ("Interactive in the notebook: this cell shows a widget in JupyterLab (download the "
               "notebook above); the static picture or list that follows shows the same.")
logger = logging.getLogger(__name__)


def _book_build():
    """book/build.py, which names the source pages (loaded by path: `build` is also the name of
    a packaging tool's module)."""
    spec = importlib.util.spec_from_file_location("minicb_book_build",
                                                  Path(__file__).with_name("build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


source_docname = _book_build().source_docname


def link_shown_source(app, doctree, docname) -> None:
    """`minicb/kv/blocks.py, lines 6-43` (the bold heading `minicb.viz.show_source` prints above
    a listing, and `show_file` above a C kernel's) becomes a link to that file's source page at
    those lines."""
    for strong in list(doctree.findall(nodes.strong)):
        if len(strong.children) != 1 or not isinstance(strong.children[0], nodes.literal):
            continue
        match = SHOWN_SOURCE.fullmatch(strong.astext())
        if not match:
            continue
        path, first, last = match.groups()
        target = source_docname(path)
        if target not in app.env.all_docs:
            logger.warning(f"{docname}: no source page for {path} (shown as {strong.astext()!r})",
                           location=docname)
            continue
        uri = app.builder.get_relative_uri(docname, target) + f"#L{first}-L{last}"
        reference = nodes.reference("", "", internal=True, refuri=uri,
                                    classes=["minicb-source-link"])
        reference += strong.deepcopy()
        strong.replace_self(reference)


def replace_widgets(app, doctree, docname) -> None:
    """A widget output without saved state would render as nothing: say where it runs."""
    for raw in list(doctree.findall(nodes.raw)):
        if WIDGET_MIME not in raw.astext():
            continue
        note = nodes.paragraph("", "", nodes.emphasis("", WIDGET_NOTE),
                               classes=["minicb-widget-note"])
        raw.replace_self(note)


def setup(app):
    app.connect("doctree-resolved", link_shown_source)
    app.connect("doctree-resolved", replace_widgets)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
