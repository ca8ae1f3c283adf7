"""How trainmap writes figures (matplotlib, Agg backend; atomically, as PNG or SVG): each concern
keeps its own plots (:mod:`trainmap.evaluation.plots`, :mod:`trainmap.dynamics.plots`, the methods).


The same figure is the same bytes (DVC versions figures by content, like every result). An Agg PNG
carries no date. An SVG would carry two things that change on every save: its date and the random
ids of its clip paths. So this module fixes the ids' salt (``svg.hashsalt``) and registers, for the
"svg" format, matplotlib's SVG canvas with no date unless a caller gives one: every SVG a process
that imported trainmap.figures saves is reproducible, through :func:`save_figure` or a plain
``savefig`` (the training map's SVG; a job server's jobs inherit both settings by fork).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backend_bases import register_backend  # noqa: E402
from matplotlib.backends.backend_svg import FigureCanvasSVG  # noqa: E402

from trainmap.io import write_atomic  # noqa: E402


class DatelessSVGCanvas(FigureCanvasSVG):
    """matplotlib's SVG canvas, writing no ``dc:date`` unless ``metadata`` names one."""

    def print_svg(self, filename, *, bbox_inches_restore=None, metadata=None, **_):
        # savefig hands a print method outside matplotlib every renderer's keywords (dpi,
        # facecolor, ...); matplotlib's own SVG method takes only these two (the figure carries
        # the rest).
        return super().print_svg(filename, bbox_inches_restore=bbox_inches_restore,
                                 metadata={"Date": None, **(metadata or {})})  # fmt: skip


matplotlib.rcParams["svg.hashsalt"] = "trainmap"
register_backend("svg", DatelessSVGCanvas, "Scalable Vector Graphics")


def text_outside(figure: plt.Figure, tolerance: float = 1.0) -> list[str]:
    """The texts ``figure`` draws (titles, labels, tick labels, legends, annotations) that leave
    its canvas: each one's string. An empty list is a figure whose every word can be read whole
    (``tolerance``: pixels of slack). Only what is drawn counts: the texts the renderer is asked
    to draw, at the extents they are drawn with."""
    renderer = figure.canvas.get_renderer()
    drawn = []
    draw_text = renderer.draw_text

    def record(gc, x, y, s, prop, angle, ismath=False, mtext=None):  # noqa: ANN001, ANN202
        if mtext is not None and str(s).strip():
            drawn.append(mtext)
        return draw_text(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)

    renderer.draw_text = record
    try:
        figure.draw(renderer)
    finally:
        del renderer.draw_text
    box, outside = figure.bbox, []
    for text in dict.fromkeys(drawn):
        extent = text.get_window_extent(renderer)
        if (extent.x0 < box.x0 - tolerance or extent.y0 < box.y0 - tolerance
                or extent.x1 > box.x1 + tolerance or extent.y1 > box.y1 + tolerance):  # fmt: skip
            outside.append(text.get_text())
    return outside


def save_figure(figure: plt.Figure, path: str | Path, format: str = "png", dpi: int = 110,
                close: bool = True) -> None:  # fmt: skip
    """Write ``figure`` to ``path`` atomically as ``format`` ("png", "svg"), the same bytes for
    the same figure; then free it unless ``close`` is False (to save it in another format too)."""
    write_atomic(path, lambda tmp: figure.savefig(tmp, format=format, dpi=dpi))
    if close:
        plt.close(figure)


def save_png(figure: plt.Figure, path: str | Path, dpi: int = 110) -> None:
    """Write ``figure`` to ``path`` as PNG atomically, then free it."""
    save_figure(figure, path, "png", dpi)
