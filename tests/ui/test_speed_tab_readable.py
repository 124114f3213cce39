"""The speed line and the Speed tab read for a newcomer: the line says what its percentages are and
that a plan some device cannot hold would not load; the -ub axis is labelled with the -ub values and
its titles are not cut off."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from PySide6.QtGui import QImage, QPainter
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.core.devices import parse_device_decl
from offload_planner.core.placement import CPU
from offload_planner.core.speed.tps import tps_fixed
from offload_planner.ui.settings import Settings
from offload_planner.ui.speed_view import IF_IT_FIT

RES = Path(__file__).resolve().parents[2] / "resources"
LINE = re.compile(r"(if it fit: )?est\. tg [\d.]+ t/s · pp [\d.]+ t/s \(time per token: (.*)\)")


def test_speed_line_names_its_shares_and_a_plan_that_does_not_fit(qtbot: QtBot, settings: Settings) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB", "CUDA1=24GiB"))
    try:
        open_and_wait(qtbot, win, RES / "DeepSeek-V3-Q4_K_M.header.gguf")  # -ngl all: 180 GiB per GPU
        label = win.speed_label
        qtbot.waitUntil(lambda: label.text().startswith(IF_IT_FIT))
        assert LINE.fullmatch(label.text()), label.text()
        assert "CUDA0, CUDA1 cannot hold this plan" in label.toolTip()
        plot = win.ubatch_plot  # the Speed tab says so as well
        plot.button.click()
        qtbot.waitUntil(lambda: bool(plot.points), timeout=120_000)
        assert plot.status.text().startswith(IF_IT_FIT + "fastest prompt processing at -ub ")
        experts = [t.name for t in win.doc.plan.model.tensors if t.role.is_routed_expert]
        win.doc.apply_preset(dict.fromkeys(experts, CPU), "experts to CPU")  # 367 GiB in 512 GiB of RAM
        wait_projected(qtbot, win)
        qtbot.waitUntil(lambda: not label.text().startswith(IF_IT_FIT))
        m = LINE.fullmatch(label.text())
        assert m and not m.group(1), label.text()
        assert "cannot hold" not in label.toolTip()
        shares = [(n, int(p)) for n, p in re.findall(r"(\w+)\s(\d+)%", m.group(2))]
        assert shares[0][0] == CPU  # the routed experts' reads dominate a token's time
        assert [p for _n, p in shares] == sorted((p for _n, p in shares), reverse=True)  # largest first
    finally:
        win.close()

def test_ubatch_axis_reads_at_the_default_window_size(qtbot: QtBot, settings: Settings) -> None:
    """The -ub axis is labelled 64 ... 4096 without overlaps (not 6·10¹ 7·10¹ ... run together),
    and neither axis title is cut off in the tab's default height."""
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB", "CUDA1=24GiB"))
    try:
        open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
        plot = win.ubatch_plot
        win.tabs.setCurrentWidget(plot)
        plot.button.click()
        qtbot.waitUntil(lambda: bool(plot.points), timeout=120_000)
        qtbot.wait(50)
        axis = plot.plot.getAxis("bottom")
        img = QImage(10, 10, QImage.Format.Format_ARGB32)
        painter = QPainter(img)
        try:
            _axis, _ticks, texts = axis.generateDrawSpecs(painter)
        finally:
            painter.end()
        shown = [(rect, text) for rect, _flags, text in texts]
        assert [t for _r, t in shown] == ["64", "128", "256", "512", "1024", "2048", "4096"]
        rects = sorted((r for r, _t in shown), key=lambda r: r.left())
        assert all(a.right() < b.left() for a, b in itertools.pairwise(rects))
        view_h = plot.graphics.viewport().height()
        for side in ("left", "right"):
            label = plot.plot.getAxis(side).label
            text = label.document().toPlainText()
            box = label.sceneBoundingRect().adjusted(0, 4, 0, -4)  # less the text item's margins
            assert box.top() >= 0 and box.bottom() <= view_h, (side, text, box, view_h)
    finally:
        win.close()


def test_a_cpu_only_plan_plots_no_gpu_axis(qtbot: QtBot, settings: Settings, qwen3moe_path: Path) -> None:
    """No GPU: the plot had a right axis of zeros ranged -400 ... 400 with a cut "GPU GiB (x0.001)"
    title and a dashed line along 0, and the line said "0.00 GiB of GPU compute buffers"."""
    win = make_window(qtbot, settings, system_info())
    try:
        open_and_wait(qtbot, win, qwen3moe_path)
        plot = win.ubatch_plot
        win.tabs.setCurrentWidget(plot)
        plot.button.click()
        qtbot.waitUntil(lambda: bool(plot.points), timeout=120_000)
        assert not plot.plot.getAxis("right").isVisible()
        assert len(plot.buf_curve.xData if plot.buf_curve.xData is not None else []) == 0
        best = max((p for p in plot.points if p.fits), key=lambda p: p.pp_tps)
        assert plot.status.text() == (f"fastest prompt processing that fits at -ub {best.n_ubatch}: "
                                      f"{tps_fixed(best.pp_tps, 0)} t/s (no GPU compute buffers: nothing "
                                      "of the plan on a GPU)")
        # a GPU again: its axis and curve come back
        win.doc.add_device(parse_device_decl("CUDA0=24GiB"))
        wait_projected(qtbot, win)
        plot.button.click()
        def replotted() -> bool:
            return plot.button.isEnabled() and bool(plot.points) and "GiB of GPU" in plot.status.text()

        qtbot.waitUntil(replotted, timeout=120_000)
        assert plot.plot.getAxis("right").isVisible()
        assert len(plot.buf_curve.xData) == len(plot.points)
    finally:
        win.close()
