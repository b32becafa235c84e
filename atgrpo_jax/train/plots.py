"""Learning curves: one PNG, one line per run (e.g. AT-GRPO vs plain GRPO vs single agent)."""
from __future__ import annotations

import io
import math
import os
from typing import Mapping, Sequence

from atgrpo_jax import workdir as wd
from atgrpo_jax.train.metrics_files import read_metrics

AXIS_LABELS = {"step": "training step", "time_s": "wall-clock time (s)", "eval_success": "success rate (held out)"}


def curve_points(rows: Sequence[Mapping], metric: str, x: str = "step") -> list[tuple[float, float]]:
    """(x, metric) of the rows that have both as finite numbers, sorted by x; the last row wins on a repeated x."""
    points: dict[float, float] = {}
    for row in rows:
        xv, yv = row.get(x), row.get(metric)
        if isinstance(xv, bool) or isinstance(yv, bool):
            continue
        if isinstance(xv, (int, float)) and isinstance(yv, (int, float)) and math.isfinite(xv) and math.isfinite(yv):
            points[float(xv)] = float(yv)
    return sorted(points.items())


def plot_learning_curves(runs: Mapping[str, str | os.PathLike | Sequence[Mapping]], out_png: str, *, metric: str = "eval_success",
                         x: str = "step", title: str | None = None, figsize: tuple[float, float] = (6.4, 4.0),
                         dpi: int = 100) -> str:
    """Write `out_png` with one curve of `metric` against `x` per named run; returns the path.

    A run is a workdir (its metrics.jsonl is read), a .jsonl path (either may
    be a gs:// URL, as may `out_png`), or a list of metric rows. Rows without
    the metric (e.g. steps without evaluation) or with a null value are
    skipped; a run with no point at all is named "(no data)" in the legend.
    The image is `figsize * dpi` pixels.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure


    if not runs:
        raise ValueError("plot_learning_curves: no runs given")
    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)  # Agg, without touching pyplot's global backend
    ax = fig.add_subplot()
    any_points = False
    for name, run in runs.items():
        rows = read_metrics(run) if isinstance(run, (str, os.PathLike)) else run
        points = curve_points(rows, metric, x)
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.5, label=name)
            any_points = True
        else:
            ax.plot([], [], label=f"{name} (no data)")
    if not any_points:
        ax.text(0.5, 0.5, f"no {metric} values yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(AXIS_LABELS.get(x, x))
    ax.set_ylabel(AXIS_LABELS.get(metric, metric))
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    out_png = os.fspath(out_png)
    wd.makedirs(wd.dirname(wd.absolute(out_png)))
    image = io.BytesIO()
    fig.savefig(image, format=os.path.splitext(out_png)[1][1:] or "png", dpi=dpi)  # .svg, .pdf work too
    wd.write_bytes(out_png, image.getvalue())  # one whole write: also an object-store upload
    return out_png
