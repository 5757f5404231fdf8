"""Saving one report figure to several files (PNG and SVG) with one layout.

Why: ``Figure.savefig`` with ``bbox_inches="tight"``, or on a figure with a layout engine
(constrained layout), lays the figure out again for every file it writes: a draw with
rendering off, the layout engine, then the tight box. A report saves most figures as PNG and
SVG, and figures were a fifth of the test suite's CPU (issue 48, ``bench/suite_profile.py``).
Here the layout and the tight box are computed once per figure, at the first file's
resolution as ``savefig`` would for that file alone, and every file is then drawn from them.
What a reader sees does not change; each file stays the same from run to run.

Figures can be turned off (``--no-figures``, :func:`figures_off`): a reader who wants the
tables alone (an audit in CI, a test) gets them sooner, as figures are a large part of a
report's time. Every report figure is saved here or asks :func:`figures_wanted` first, so the
switch is honoured in one place; tables do not depend on it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PAD_INCHES = 0.1
"""The margin around a tight box: matplotlib's default ``savefig.pad_inches``."""

_FIGURES_ON: ContextVar[bool] = ContextVar("biaslab_figures_on", default=True)


def figures_wanted() -> bool:
    """Whether report figures are drawn here (False inside :func:`figures_off`). A plotting
    function asks this before it builds a figure, so that a figure nobody saves costs
    nothing."""
    return _FIGURES_ON.get()


@contextmanager
def figures_off(off: bool = True) -> Iterator[None]:
    """Within the block (when `off`), reports write their tables and ``report.html`` but no
    figure: :func:`save_figure` writes nothing and the plotting functions return at once."""
    token = _FIGURES_ON.set(False) if off else None
    try:
        yield
    finally:
        if token is not None:
            _FIGURES_ON.reset(token)


def save_figure(fig: "Figure", files: Sequence[tuple[Path, dict[str, Any]]], *,
                tight: bool = True) -> list[Path]:
    """Write `fig` to each ``(path, savefig keyword arguments)`` of `files`, laid out once.

    With `tight`, each file is cropped to the figure's tight box plus :data:`PAD_INCHES`
    (``bbox_inches="tight"``, measured once). A layout engine of the figure runs once, then is
    held off while the files are drawn, as ``savefig`` holds it off for one file.

    Returns:
        The paths written, in the order given; none while figures are off
        (:func:`figures_off`).
    """
    if not figures_wanted():
        return []
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    dpi = files[0][1].get("dpi") if files else None
    if isinstance(dpi, (int, float)):
        fig.set_dpi(dpi)  # lay out and measure at the first file's resolution
    fig.draw_without_rendering()  # the layout engine, once
    crop: dict[str, Any] = {}
    if tight:
        box = fig.get_tightbbox(fig.canvas.get_renderer())
        crop["bbox_inches"] = box.padded(PAD_INCHES)
    engine = fig.get_layout_engine()
    fig.set_layout_engine("none")
    try:
        for path, kwargs in files:
            fig.savefig(path, **kwargs, **crop)
    finally:
        if engine is not None:
            fig.set_layout_engine(engine)
    return [path for path, _ in files]
