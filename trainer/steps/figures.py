"""HTML and figure helpers shared by the step reports (evaluate's and tune's pages).

Figures are drawn without pyplot (no global backend state) and embedded as base64 PNG data
URIs, so every report is one self-contained HTML file.
"""

from __future__ import annotations

import base64
import io
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["CSS", "figure", "img", "png"]

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:70rem;color:#1f2328;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem}
h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #d0d7de;padding-bottom:.3rem}
.sub{color:#59636e;margin-top:0}
.gate{border-radius:8px;padding:1rem 1.2rem;margin:1.2rem 0;font-size:1.1rem}
.gate.pass{background:#dafbe1;border:2px solid #1a7f37}
.gate.fail{background:#ffebe9;border:2px solid #cf222e}
.gate strong{font-size:1.4rem;margin-right:.6rem}
table{border-collapse:collapse;margin:.5rem 0}
th,td{border:1px solid #d0d7de;padding:.3rem .7rem;text-align:right}
th:first-child,td:first-child{text-align:left}
tr.gate-metric{font-weight:bold;background:#fff8c5}
img{max-width:100%;height:auto;display:block;margin:.5rem 0}
.note{color:#59636e;font-style:italic}
dl{display:grid;grid-template-columns:max-content auto;gap:.2rem 1rem}
dt{font-weight:bold}dd{margin:0;word-break:break-all}
"""
"""The reports' shared style sheet."""


def figure(width: float, height: float) -> Figure:
    """A figure not registered with pyplot, so no global backend state is touched."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def png(fig: Figure) -> str:
    """The figure as base64 PNG text for a data: URI."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def img(png: str, alt: str) -> str:
    """An ``<img>`` tag showing base64 PNG text ``png``."""
    return f'<img src="data:image/png;base64,{png}" alt="{escape(alt)}">'
