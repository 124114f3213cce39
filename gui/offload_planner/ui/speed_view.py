"""The speed estimate under the memory bars: one line, live for every edit, the details on hover;
prefixed "if it fit:" while a device is over capacity.

Thin over :mod:`offload_planner.core.speed`: figures from the devices' declarations, the cached RAM
probe of this machine (never measured from the GUI thread) and the efficiencies measured here.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QLabel, QWidget

from offload_planner.backend.speed_store import plan_speed, probe_speed_note
from offload_planner.core.errors import PlannerError
from offload_planner.core.loadable import context_error
from offload_planner.core.mapped_span import unified_over
from offload_planner.core.speed.advice import faster_hints
from offload_planner.core.speed.bottleneck import HOST_KV_PART
from offload_planner.core.speed.report import SPLIT_MEANING, speed_lines
from offload_planner.core.speed.result import SpeedEstimate
from offload_planner.ui.document import PlanDocument
from offload_planner.ui.memory_view import bar_figures, faster_text
from offload_planner.ui.rates import rate_text as _rate

#: Before the estimate of a plan some device cannot hold: llama-server would not load it.
IF_IT_FIT = "if it fit: "
#: The tooltip's first line: the line's abbreviations in words.
TERMS = ("<b>tg</b>: token generation, how fast the answer is written; <b>pp</b>: prompt processing, "
         "how fast a prompt is read; <b>t/s</b>: tokens per second; <b>time per token</b>: each "
         "device's share of the time one generated token takes; <b>graph split</b>: " + SPLIT_MEANING + ".")


#: Under an uncalibrated estimate's assumptions: how to make it this machine's, or another machine's (it
#: said "uncalibrated" on every efficiency with no word of what to do about it).
UNCALIBRATED = ("<b>uncalibrated</b>: the efficiencies are round defaults. The Launch tab's Bench (once "
                "llama-server listens) measures this machine's and later estimates use them; for another "
                "machine, declare its figures: <code>offload-planner gui --device "
                "CPU=512GiB,ram=12xDDR5-4800</code> (GPUs: <code>--device CUDA0=rtx3090</code> or "
                "<code>bw=</code>, <code>tflops=</code>).")


def window_line(est: SpeedEstimate, over: list[str]) -> str:
    """``est. tg 9.8 t/s · pp 210 t/s (time per token: CPU 61% · CUDA0 39%)``: every device a token
    takes time on, by its share, largest first ("<1%": a GPU with a few layers was left out, as if it
    held nothing); ``over``: devices over capacity (then "if it fit: ")."""
    shares = sorted((d for d in est.devices if d.share > 0), key=lambda d: -d.share)
    text = f"est. tg {_rate(est.tg_tps)} t/s"
    if est.spec is not None:
        text += f" with {est.spec.kind.split(' (')[0]} ({_rate(est.spec.tg_tps_plain)} without)"
    text += f" · pp {_rate(est.pp_tps)} t/s"
    if shares:
        # a no-break space: the wrapped line broke "CUDA1 / <1%" apart at 1024 px
        text += " (time per token: " + " · ".join(f"{d.name}\u00a0{_share(d.share)}" for d in shares)
        splits = _splits_share(est)
        if splits >= SPLITS_SHOWN:  # the rest of the token: the shares above summed to 2% on an rpc-server
            text += f"; graph splits\u00a0{_share(splits)}"
        text += ")"
    if est.host_kv_layers:  # -nkvo: the host-KV attention where it is the bottleneck, at depth 0 or at -c
        slow = next((b for b in (est.bottleneck, est.bottleneck_at_ctx) if b.startswith(HOST_KV_PART)), "")
        if slow:
            at = "" if slow == est.bottleneck else f" at {est.n_ctx} tokens"
            text += f" · bottleneck{at}: {slow}"
    return IF_IT_FIT + text if over else text


#: The share of a token's time the graph splits' latency takes from which the line names it (the
#: devices' shares alone summed to 2% for a small model on an rpc-server, 98% its round trips).
SPLITS_SHOWN = 0.10


def _splits_share(est: SpeedEstimate) -> float:
    """The share of a plain token's time (the devices' shares are of it) its graph splits take."""
    plain = est.spec.tg_tps_plain if est.spec is not None else est.tg_tps
    return est.split_ms * plain / 1e3 if plain > 0 else 0.0


def _share(share: float) -> str:
    return "<1%" if share < 0.005 else f"{100 * share:.0f}%"


class SpeedLabel(QLabel):
    #: what would make the plan faster, in the window's words (memory_view.faster_text; "" for nothing)
    fasterChanged = Signal(str)

    def __init__(self, doc: PlanDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = doc
        self.faster: str | None = ""  # what would make the plan faster (fasterChanged)
        self.setAccessibleName("Speed estimate")
        self.setWordWrap(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # coalesced: the edit returns at once, the line follows in the same event-loop turn
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(0)
        self._timer.timeout.connect(self.refresh)
        doc.planChanged.connect(self._timer.start)
        doc.modelChanged.connect(self._timer.start)
        doc.modelChanged.connect(self._forget_faster)  # another model's line is not kept for this one
        doc.analysisChanged.connect(self._timer.start)  # whether the plan fits comes with its projection
        self.refresh()

    def refresh(self) -> None:
        last, self.faster = self.faster, ""
        self._refresh()
        if self.faster is None:  # the projection is on its way: keep the line until it comes (no flicker)
            self.faster = last
        self.fasterChanged.emit(self.faster)

    def _forget_faster(self) -> None:
        self.faster = ""

    def _refresh(self) -> None:
        if not self._doc.has_plan:
            self.setText("")
            self.setToolTip("")
            return
        if self._doc.plan.context.n_batch == 0:  # a pasted -b 0 ("float division by zero" before)
            self.setText("no speed estimate: -b 0 leaves llama.cpp batches of 0 tokens, no prompt is "
                         "processed (set Batch -b)")
            self.setToolTip("")
            return
        # a trained context of 0 and no -c: micro-batches of 0 tokens ("float division by zero" before)
        if context_error(self._doc.plan.model, self._doc.plan.context.n_ctx):
            self.setText("no speed estimate: the model's trained context is 0 (see Problems): set Context, "
                         "e.g. 4096")
            self.setToolTip("")
            return
        try:
            est = plan_speed(self._doc.plan, probe=False, placement=self._doc.placement)
        except (PlannerError, ValueError, KeyError, ZeroDivisionError) as e:
            self.setText(f"speed estimate unavailable: {e}")
            self.setToolTip("")  # not the last plan's assumptions under this plan's line
            return
        over = self._over()
        self.setText(window_line(est, over))
        self.faster = "" if over else self._faster(est)
        note = (f"<b>{', '.join(over)} cannot hold this plan</b>: llama-server would not load it; the "
                "estimate is for the placement as drawn.<br>") if over else ""
        probe = probe_speed_note(self._doc.plan.devices)  # another machine's RAM at this one's speed
        note += f"<b>RAM speed</b>: {html.escape(probe, quote=False)}.<br>" if probe else ""
        self.setToolTip(note + TERMS + "<pre>" + "\n".join(speed_lines(est)).replace("&", "&amp;")
                        .replace("<", "&lt;") + "</pre>" + ("" if est.calibrated else UNCALIBRATED))

    def _over(self) -> list[str]:
        return over_capacity(self._doc)

    def _faster(self, est: SpeedEstimate) -> str | None:
        """What would make the plan faster; None while its projection is not current (the next refresh
        comes with it)."""
        a = self._doc.analysis
        if a is None or a.projection is None or not self._doc.analysis_current:
            return None
        return faster_text(faster_hints(self._doc.plan, a.projection, est, self._doc.placement))


def over_capacity(doc: PlanDocument) -> list[str]:
    """Devices over capacity in the document's projection ([] while it is not current)."""
    a = doc.analysis
    if a is None or a.projection is None or not doc.analysis_current:
        return []
    over = [dm.device.name for dm in a.projection.devices if bar_figures(dm).over]
    cpu = a.plan.devices.cpu.name
    if cpu not in over and unified_over(a.projection):  # a Mac's one RAM, as plan counts it (exit 3)
        over.append(cpu)
    return over
