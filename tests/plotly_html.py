"""The figures of a plotly ``report.html``, read back from the file as a browser gets them.

plotly writes each figure as ``Plotly.newPlot("DIV_ID", DATA, LAYOUT, CONFIG)`` in a script, its
numeric arrays as base64 typed arrays (``{"dtype": "f8", "bdata": ...}``); this module parses
both back, so a test checks the numbers a reader of the page sees.
"""

from __future__ import annotations

import base64
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np

NEW_PLOT = re.compile(r'Plotly\.newPlot\(\s*"([^"]+)",\s*')
VOID = {"meta", "br", "img", "link", "input", "hr"}


class TagBalance(HTMLParser):
    """Every element opened is closed, in order; the tags seen and every ``src`` asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.seen: list[str] = []
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.seen.append(tag)
        self.sources += [value or "" for key, value in attrs if key == "src"]
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open, f"</{tag}> closes nothing"
        assert self.open[-1] == tag, f"</{tag}> closes <{self.open[-1]}>"
        self.open.pop()


def check_html(text: str) -> list[str]:
    """Assert ``text`` is a whole, balanced HTML document that loads nothing from elsewhere
    (it must draw offline); return its tags in order."""
    assert text.startswith("<!DOCTYPE html>")
    parser = TagBalance()
    parser.feed(text)
    parser.close()
    assert parser.open == [], f"unclosed: {parser.open}"
    assert parser.sources == [], f"loads {parser.sources}"
    return parser.seen


def figures_in(path: Path) -> dict[str, dict[str, Any]]:
    """Each figure of the page by its div id: ``{"data": [...], "layout": {...}}``."""
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    figures = {}
    for match in NEW_PLOT.finditer(text):
        data, end = decoder.raw_decode(text, match.end())
        rest = text[end:].lstrip()
        assert rest.startswith(","), rest[:40]
        layout, _ = decoder.raw_decode(rest[1:].lstrip())
        figures[match.group(1)] = {"data": data, "layout": layout}
    return figures


def values(array: Any) -> np.ndarray:
    """A trace's ``x`` or ``y`` as numpy: a base64 typed array, or a plain list."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"])
    return np.asarray(array)


def traces(figure: dict[str, Any], axis: str = "y") -> dict[str, dict[str, Any]]:
    """The figure's traces on one y axis (``y``, ``y2``, ...), by name."""
    return {t["name"]: t for t in figure["data"] if t.get("yaxis", "y") == axis}
