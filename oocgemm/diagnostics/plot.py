"""A Gantt chart of a timeline, one row per lane.

matplotlib is an optional dependency (``pip install 'oocgemm[plot]'``), imported only here and
only when a plot is drawn. The figure is drawn without pyplot, so that plotting changes no
global matplotlib state (backend, current figure).
"""

from __future__ import annotations

import os

from ..errors import DependencyError, OutputError
from .events import KIND_COLORS, KIND_NAMES
from .lanes import tracks

_HINT = "pip install 'oocgemm[plot]' (or pip install matplotlib)"


def require_matplotlib():
    """The ``matplotlib`` module; :class:`DependencyError` with the install hint without it."""
    try:
        import matplotlib
        from matplotlib.figure import Figure  # noqa: F401 - part of the check
    except ImportError as exc:
        raise DependencyError(f"plotting a timeline needs matplotlib, which is not installed "
                              f"({exc}); {_HINT}") from None
    return matplotlib


def check_plot_path(path) -> None:
    """Before any work: matplotlib is installed and ``path``'s suffix names a format it
    writes (with no suffix it writes a PNG), so that a plot asked of a run cannot fail
    after it.

    Raises
    ------
    DependencyError
        matplotlib is not installed.
    OutputError
        The suffix names no format that matplotlib writes.
    """
    require_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in formats:
        others = ", ".join("." + f for f in sorted(formats) if f not in ("png", "svg", "pdf"))
        raise OutputError(f"cannot write the plot to {os.fspath(path)!r}: matplotlib does not "
                          f"write {suffix!r} files; name it .png, .svg or .pdf (or {others})")


def plot_timeline(timeline, path=None, *, title: str | None = None):
    """Draw ``timeline`` as a Gantt chart; write it to ``path`` when given.

    Parameters
    ----------
    timeline
        A :class:`~oocgemm.diagnostics.timeline.Timeline`.
    path
        Where to write the figure; the suffix picks the format (.png, .svg, .pdf).
    title
        Replaces the default title (the product, wall time, rate, compute busy, exposed copy
        and bound).

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    DependencyError
        matplotlib is not installed.
    OutputError
        ``path`` cannot be written.
    """
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = tracks(timeline.events)
    fig = Figure(figsize=(12, 1.6 + 0.28 * max(len(rows), 1)), layout="constrained")
    ax = fig.add_subplot()
    origin = timeline.start
    kinds_seen = []
    for y, (_, evs) in enumerate(rows):
        by_kind: dict[str, list] = {}
        for e in evs:
            by_kind.setdefault(e.kind, []).append((e.start - origin, e.end - e.start))
        for kind, spans in by_kind.items():
            ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=KIND_COLORS.get(kind, "#7f7f7f"),
                           linewidth=0)
            if kind not in kinds_seen:
                kinds_seen.append(kind)
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first lane (compute) on top
    ax.set_xlim(0, max(timeline.wall, 1e-9))
    ax.set_xlabel("seconds from the first operation")
    ax.grid(axis="x", alpha=0.3)
    order = [k for k in KIND_COLORS if k in kinds_seen]
    if order:
        ax.legend(handles=[Patch(color=KIND_COLORS[k], label=KIND_NAMES.get(k, k)) for k in order],
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize="small")
    if title is None:
        title = (f"{timeline.headline()}\nidle compute: fill "
                 f"{timeline.fill * 1e3:.3g} ms, stalls {timeline.stalls * 1e3:.3g} ms, drain "
                 f"{timeline.drain * 1e3:.3g} ms; bound: {timeline.bound}")
    ax.set_title(title, fontsize="medium", loc="left")
    if path is not None:
        try:
            fig.savefig(os.fspath(path), dpi=120)
        except (OSError, ValueError) as exc:  # ValueError: a suffix with no known format
            raise OutputError(f"cannot write the plot to {os.fspath(path)!r}: "
                              f"{getattr(exc, 'strerror', None) or exc}") from None
    return fig
