"""Whether a figure can be read: no text drawn over other text, none cut off.

A figure is checked after `canvas.draw()` on the extents the renderer gives each visible text
artist (tick labels, axis labels, titles, annotations, legend entries, figure texts). Two
problems are reported:

* overlap: two texts whose window extents intersect by more than `TOLERANCE_PX` in both
  directions (tick labels printed into one grey band, error labels over each other);
* cut off: a text outside the saved image (the figure, or with `savefig.bbox: tight` the
  tight box `save_figure` writes), or one that its axes clip (a value label above the top).

Why here and not only in tests: `save_figure` runs it on every figure the notebooks write, so
`make test` (nbval, strict) checks every figure `make reproduce` produces, on its real data.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator

import matplotlib.pyplot as plt
from matplotlib.text import Text
from matplotlib.transforms import Bbox

TOLERANCE_PX = 1.0
"""Extents touching by a pixel are not an overlap (glyph boxes carry some padding)."""

STRICT_ENV = "KVREPRO_STRICT_FIGURES"
"""Set to 1 (`make test` does for the notebooks): `save_figure` raises on an illegible figure
instead of warning."""


class IllegibleFigure(ValueError):
    """A figure with text over text or text cut off; the message names figure and texts."""


@contextlib.contextmanager
def _drawn_texts(fig: plt.Figure) -> Iterator[list[tuple[Text, Bbox]]]:
    """Each text artist `fig.canvas.draw()` really draws, with its extent. Why record the draw
    rather than walk the artists: matplotlib keeps spare tick objects and hidden labels that
    `findobj` returns but the image never shows."""
    drawn: list[tuple[Text, Bbox]] = []
    original = Text.draw

    def draw(self: Text, renderer: object) -> None:
        original(self, renderer)
        if self.get_visible() and self.get_text().strip() and self.figure is fig:
            drawn.append((self, self.get_window_extent(renderer)))

    Text.draw = draw  # type: ignore[method-assign]
    try:
        yield drawn
    finally:
        Text.draw = original  # type: ignore[method-assign]


def _overlap(a: Bbox, b: Bbox) -> bool:
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return width > TOLERANCE_PX and height > TOLERANCE_PX


def _inside(inner: Bbox, outer: Bbox) -> bool:
    return (inner.x0 >= outer.x0 - TOLERANCE_PX and inner.y0 >= outer.y0 - TOLERANCE_PX
            and inner.x1 <= outer.x1 + TOLERANCE_PX and inner.y1 <= outer.y1 + TOLERANCE_PX)


def _shown(text: Text) -> str:
    label = " ".join(text.get_text().split())
    return repr(label if len(label) <= 40 else label[:37] + "...")


def _canvas(fig: plt.Figure, renderer: object) -> Bbox:
    """The area the saved image shows: the tight box where `save_figure` saves tight."""
    if plt.rcParams["savefig.bbox"] == "tight":
        tight = fig.get_tightbbox(renderer)  # in inches
        return Bbox.union([Bbox.from_extents(*(v * fig.dpi for v in tight.extents)),
                           fig.bbox])
    return fig.bbox


def text_problems(fig: plt.Figure) -> list[str]:
    """One line per overlapping pair and per cut-off text of `fig` (empty: legible)."""
    with _drawn_texts(fig) as drawn:
        fig.canvas.draw()
    canvas = _canvas(fig, fig.canvas.get_renderer())
    problems = [f"text {_shown(ta)} overlaps {_shown(tb)}"
                for (ta, a), (tb, b) in itertools.combinations(drawn, 2) if _overlap(a, b)]
    for text, box in drawn:
        clip = text.get_clip_box() if text.get_clip_on() else None
        if clip is not None and not _inside(box, clip):
            problems.append(f"text {_shown(text)} is clipped by its axes")
        elif not _inside(box, canvas):
            problems.append(f"text {_shown(text)} leaves the canvas")
    return problems


def check_legible(fig: plt.Figure, name: str, strict: bool | None = None) -> list[str]:
    """`text_problems` of figure `name`; raises IllegibleFigure when `strict` (default: the
    `KVREPRO_STRICT_FIGURES` environment variable is 1), else returns them."""
    problems = text_problems(fig)
    if strict is None:
        strict = os.environ.get(STRICT_ENV) == "1"
    if problems and strict:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more"
                                           if len(problems) > 5 else "")
        raise IllegibleFigure(f"figure {name}: {len(problems)} legibility problem(s): {shown}")
    return problems
