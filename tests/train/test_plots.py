"""Learning-curve PNGs: size, one curve per run, missing points."""
import struct

import numpy as np
import pytest
from matplotlib import colors
from matplotlib.image import imread

from atgrpo_jax.train.metrics import MetricsWriter
from atgrpo_jax.train.plots import curve_points, plot_learning_curves

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    """(width, height) from the PNG's IHDR chunk, read by hand."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def pixels_near(image, hex_color, tol=0.03):
    rgb = np.asarray(colors.to_rgb(hex_color))
    return int(np.sum(np.all(np.abs(image[..., :3] - rgb) < tol, axis=-1)))


def test_curve_points_skip_missing_and_bad_values():
    rows = [{"step": 3, "eval_success": 0.5}, {"step": 1, "loss": 2.0},  # no metric: skipped
            {"step": 2, "eval_success": None}, {"step": 4, "eval_success": float("nan")},
            {"step": 5, "eval_success": True}, {"eval_success": 0.9},  # bool, no x
            {"step": 1, "eval_success": 0.1}, {"step": 3, "eval_success": 0.7}]  # repeated x: last wins
    assert curve_points(rows, "eval_success") == [(1.0, 0.1), (3.0, 0.7)]
    timed = [{"step": s, "time_s": 10.0 * s, "eval_success": s / 4} for s in (2, 1)]
    assert curve_points(timed, "eval_success", x="time_s") == [(10.0, 0.25), (20.0, 0.5)]


def test_three_runs_one_png_with_each_curve(tmp_path):
    workdir = tmp_path / "at_grpo"
    with MetricsWriter(str(workdir)) as w:
        for step in range(1, 21):
            w.write(step, {"loss": 1.0 / step, **({"eval_success": step / 20} if step % 5 == 0 else {})})
    grpo = tmp_path / "grpo.jsonl"
    grpo.write_text("".join(f'{{"step": {s}, "eval_success": {0.3 * s / 20}}}\n' for s in range(5, 21, 5)))
    single = [{"step": 5, "eval_success": 0.1}, {"step": 10}, {"step": 15, "eval_success": None},
              {"step": 20, "eval_success": 0.2}]
    out = tmp_path / "figs" / "curves.png"
    got = plot_learning_curves({"AT-GRPO": str(workdir), "plain GRPO": str(grpo), "single agent": single},
                               str(out), title="CPU demo", figsize=(8, 5), dpi=80)
    assert got == str(out) and out.stat().st_size > 5000
    assert png_size(out) == (640, 400)
    image = imread(str(out))
    assert image.shape[:2] == (400, 640)
    for color in ("#1f77b4", "#ff7f0e", "#2ca02c"):  # matplotlib's first three line colors
        assert pixels_near(image, color) > 30, color
    assert pixels_near(image, "#d62728") == 0  # no fourth curve


def test_runs_without_points_do_not_crash(tmp_path):
    out = tmp_path / "empty.png"
    plot_learning_curves({"a": [{"step": 1, "loss": 0.3}], "b": []}, str(out), x="time_s")
    assert png_size(out) == (640, 400)
    with pytest.raises(ValueError, match="no runs"):
        plot_learning_curves({}, str(out))
    with pytest.raises(FileNotFoundError):
        plot_learning_curves({"missing": str(tmp_path / "nope")}, str(out))
