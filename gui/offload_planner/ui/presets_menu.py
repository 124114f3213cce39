"""The Presets menu: common placements as one undo step each (logic in :mod:`presets`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QMenu,
    QSpinBox,
    QWidget,
)

from offload_planner.core import presets
from offload_planner.core.memory import Projection
from offload_planner.core.placement import CPU
from offload_planner.core.plan import Plan
from offload_planner.core.speed.advice import layers_text
from offload_planner.ui.document import PlanDocument
from offload_planner.ui.speed_view import over_capacity

if TYPE_CHECKING:  # the search is imported when first used
    from offload_planner.core.speed.candidate import FastestResult
    from offload_planner.core.speed.result import SpeedEstimate


#: Why the routed-expert presets are off on a dense model, and what to use instead.
DENSE = ("this model is dense: set GPU layers (-ngl) under Options and watch the memory bars and the speed "
         "line")
DENSE_TIP = f"No routed experts to move: {DENSE}, or move whole layers (Move layers…)"


class MoveLayersDialog(QDialog):
    def __init__(self, doc: PlanDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Move layers")
        n = doc.plan.model.summary.n_layer
        self.first = QSpinBox()
        self.last = QSpinBox()
        for s in (self.first, self.last):
            s.setRange(0, max(0, n - 1))
        self.last.setValue(max(0, n - 1))
        self.device = QComboBox()
        self.device.addItems(doc.device_names())
        self.experts_only = QCheckBox("routed experts only")
        form = QFormLayout(self)
        form.addRow("From layer", self.first)
        form.addRow("To layer", self.last)
        form.addRow("Device", self.device)
        form.addRow("", self.experts_only)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)


FASTEST_TIP = ("Routed experts onto the GPUs layer by layer as far as each GPU's memory minus its margin "
               "allows, -ub raised where prompt processing gains; keeps your -ot rules and moves. Fastest "
               "for a request: a 4096-token prompt and a 512-token answer (fit's --goal balanced), so tg "
               "may drop a little where pp gains much (speed estimate: see under the memory bars). One "
               "undo step")


class PresetsMenu(QMenu):
    message = Signal(str)

    def __init__(self, doc: PlanDocument, parent: QWidget | None = None) -> None:
        super().__init__("Presets", parent)
        self._doc = doc
        self.allow_kv_quant = False  # the Fastest plan may make an f16 KV cache q8_0
        self.allow_nkvo = False  # the Fastest plan may keep the KV cache in RAM (-nkvo)
        #: this machine's RAM when the window plans on it (None: the CPU was declared with --device)
        self.machine_ram: int | None = None
        self.setToolTipsVisible(True)  # a QMenu hides its actions' tooltips unless told
        self.aboutToShow.connect(self._build)
        self._build()

    def _build(self) -> None:
        self.clear()
        doc = self._doc
        if not doc.has_plan:
            self.addAction("(no model)").setEnabled(False)
            return
        experts = [self.addAction("All routed experts → CPU", lambda: self.routed_experts_to(CPU))]
        for g in doc.plan.devices.gpus:
            experts.append(self.addAction(
                f"Fill {g.name} with routed experts from layer 0",
                self._filler(g.name, from_first=True),
            ))
            experts.append(self.addAction(
                f"Fill {g.name} with routed experts from the last layer",
                self._filler(g.name, from_first=False),
            ))
        if not doc.plan.model.summary.n_expert:  # a dense model: they did nothing, saying "already there"
            for a in experts:
                a.setEnabled(False)
                a.setToolTip(DENSE_TIP)
        self.addAction("Move layers…", self.move_layers_dialog)
        # shown whatever the model and devices (off, saying why): an entry that was not there at all
        # left its user looking for it
        fast = self.addAction("Fastest plan", self.fastest)
        fast.setToolTip(FASTEST_TIP)
        if not doc.plan.devices.gpus:
            fast.setEnabled(False)
            fast.setToolTip("Fastest plan places routed experts on the GPUs: add one first (+ Virtual GPU… "
                            "in Devices)")
        elif not doc.plan.model.summary.n_expert:
            fast.setEnabled(False)
            fast.setToolTip(f"Fastest plan places the routed experts of a Mixture-of-Experts model; {DENSE}")
        else:
            kv = self.addAction("Fastest plan may quantize the KV cache (q8_0)")
            kv.setCheckable(True)
            kv.setChecked(self.allow_kv_quant)
            kv.setToolTip("Let Fastest plan make an f16 KV cache q8_0 (-ctk/-ctv) where that is faster; a "
                          "quantized V cache only with flash attention, as llama.cpp requires. Off: your "
                          "KV cache types are kept")
            kv.toggled.connect(self._set_allow_kv_quant)
            nkvo = self.addAction("Fastest plan may keep the KV cache in RAM (-nkvo)")
            nkvo.setCheckable(True)
            nkvo.setChecked(self.allow_nkvo)
            nkvo.setToolTip("Let Fastest plan try the KV cache in system RAM (-nkvo; in Options: \"KV cache "
                            "on the layer's GPU\" off): its GPU memory left to routed experts, the "
                            "attention's round trips to the host counted in the estimate; it wins mostly "
                            "where the cache alone would not fit the GPUs. Off: the cache stays where your "
                            "command puts it")
            nkvo.toggled.connect(self._set_allow_nkvo)
        if doc.plan.dialect.fits_by_default and doc.plan.devices.gpus:
            fit = self.addAction("What llama.cpp's --fit would run", self.llama_fit)
            fit.setToolTip("The pinned llama-server fits by default: -c, -ngl, -ts and expert overrides "
                           "chosen by its own search for each GPU's free memory (1 GiB margin)")
        self.addSeparator()
        back = self.addAction("Back to the command's default (clear all moves)", self.clear_moves)
        back.setEnabled(bool(doc.plan.moves))

    def _filler(self, device: str, *, from_first: bool) -> Callable[[], None]:
        def run() -> None:
            self.fill(device, from_first=from_first)

        return run

    def _projection(self) -> Projection | None:
        a = self._doc.analysis
        if a is not None and self._doc.analysis_current:
            return a.projection
        try:
            return self._doc.plan.projection()  # a preset click may wait for one projection
        except Exception as e:
            self.message.emit(f"Cannot project the plan: {e}")
            return None

    def routed_experts_to(self, device: str) -> bool:
        moves = presets.routed_experts_to(self._doc.plan, self._doc.placement, device)
        ok = self._doc.apply_preset(moves, f"All routed experts to {device}")
        self.message.emit(
            f"Moved {len(moves)} tensors to {device}" if ok else "Routed experts are already there"
        )
        return ok

    def fill(self, device: str, *, from_first: bool) -> bool:
        proj = self._projection()
        if proj is None:
            return False
        moves = presets.fill_with_experts(
            self._doc.plan, self._doc.placement, proj, device, from_first=from_first
        )
        where = "layer 0" if from_first else "the last layer"
        ok = self._doc.apply_preset(moves, f"Fill {device} with routed experts from {where}")
        if ok:
            # layers whose experts are on the device now, whether moved there or already placed
            # there by the command's split
            got = sorted(
                {
                    p.tensor.layer
                    for p in self._doc.placement.items
                    if p.tensor.role.is_routed_expert and p.tensor.layer is not None and p.device == device
                }
            )
            self.message.emit(
                (f"{device} holds the routed experts of {layers_text(got)}"
                 if got
                 else f"Moved {len(moves)} tensors off {device}: no expert layer fits")
                + _span_over_text(self._doc.plan, device)
            )
        else:
            self.message.emit(_fill_refused_text(proj, device, self._doc.plan)
                              or f"{device} already holds as many expert layers as fit")
        return ok

    def llama_fit(self) -> bool:
        from PySide6.QtCore import Qt
        from PySide6.QtWidgets import QApplication

        QApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
        try:
            fitted, result = presets.llama_fit(self._doc.plan)
        except Exception as e:  # a core bug must not take the window down
            self.message.emit(f"--fit could not be simulated: {type(e).__name__}: {e}")
            return False
        finally:
            QApplication.restoreOverrideCursor()
        if result.status != "success":
            self.message.emit(f"llama.cpp's --fit would fail here ({result.status}): {result.message}")
            return False
        if fitted == self._doc.plan:
            self.message.emit("llama.cpp's --fit would keep this plan as it is")
            return False
        self._doc.replace_plan(fitted, "llama.cpp --fit")
        self.message.emit(f"As llama.cpp's --fit would run it: -c {result.n_ctx}, -ngl {result.n_gpu_layers}"
                          + (f", {len(result.overrides)} expert overrides" if result.overrides else ""))
        return True

    def _set_allow_kv_quant(self, on: bool) -> None:
        self.allow_kv_quant = on

    def _set_allow_nkvo(self, on: bool) -> None:
        self.allow_nkvo = on

    def fastest(self) -> bool:
        from PySide6.QtCore import Qt
        from PySide6.QtWidgets import QApplication

        from offload_planner.core.loadable import context_error

        # a trained context of 0 and no -c: the search's estimates divided by 0 (ZeroDivisionError before)
        if context_error(self._doc.plan.model, self._doc.plan.context.n_ctx):
            self.message.emit("The fastest plan could not be searched: the model's trained context is 0 (see "
                              "Problems): set Context, e.g. 4096")
            return False
        QApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
        try:
            result = fastest_plan(self._doc.plan, allow_kv_quant=self.allow_kv_quant,
                                  allow_nkvo=self.allow_nkvo)
        except Exception as e:  # a core bug must not take the window down
            self.message.emit(f"The fastest plan could not be searched: {type(e).__name__}: {e}")
            return False
        finally:
            QApplication.restoreOverrideCursor()
        found = result.best
        if found is None:
            self.message.emit("Nothing fits these devices" + (f": {result.why}" if result.why else "")
                              + _ram_hint(self._doc.plan, result.why, self.machine_ram))
            return False
        best = found.plan
        held = _held_by_rules(best)
        if best == self._doc.plan:
            self.message.emit("This plan is already the fastest the search finds" + held)
            return False
        c, was = best.context, self._doc.plan.context
        kv = f", KV cache {c.type_k}/{c.type_v}" if (c.type_k, c.type_v) != (was.type_k, was.type_v) else ""
        if was.offload_kqv and not c.offload_kqv:
            kv += ", KV cache in RAM (-nkvo)"
        kv += _unmapped_text(self._doc.plan, best) + _top_layers_text(self._doc.plan, best)
        batch = f"-b {c.n_batch} " if c.n_batch != was.n_batch else ""
        ts = best.placement_options.tensor_split
        split = ""  # a layer split of its own (fit's "own -ts"): the map's layers change GPU with it
        if ts and ts != self._doc.plan.placement_options.tensor_split:
            split = "-ts " + ",".join(f"{t:g}" for t in ts) + " (its own layer split), "
        gain = _speed_change(self._doc.plan, best, over_capacity(self._doc))
        self._doc.replace_plan(best, "Fastest plan")
        self.message.emit(f"Fastest plan: {gain}{_moved_count(best)} tensors moved (marked on the map), "
                          f"{split}{batch}-ub {c.n_ubatch}{kv}{held}")
        return True

    def move_layers(self, first: int, last: int, device: str, *, experts_only: bool = False) -> bool:
        moves = presets.layers_to(
            self._doc.plan, self._doc.placement, first, last, device, experts_only=experts_only
        )
        what = "routed experts of layers" if experts_only else "layers"
        return self._doc.apply_preset(moves, f"Move {what} {first}-{last} to {device}")

    def move_layers_dialog(self) -> None:
        dlg = MoveLayersDialog(self._doc, self.parentWidget())
        if dlg.exec() == QDialog.DialogCode.Accepted:
            self.move_layers(
                dlg.first.value(),
                dlg.last.value(),
                dlg.device.currentText(),
                experts_only=dlg.experts_only.isChecked(),
            )

    def clear_moves(self) -> bool:
        return self._doc.apply_preset(presets.back_to_default(self._doc.plan), "Clear all moves")


def _span_over_text(plan: Plan, device: str) -> str:
    """"; MTL0 is still over: ..." where ``device`` maps the file (Metal with mmap) and its mapped span,
    which holds the CPU's tensors lying between its own, keeps it over; "" otherwise (no projection
    made for a GPU that does not map the file)."""
    from offload_planner.core.mapped_span import mapping_gpus, spans_over
    from offload_planner.core.units import GiB

    if device not in mapping_gpus(plan):
        return ""
    over = [o for o in spans_over(plan.projection()) if o.device == device]
    if not over:
        return ""
    o = over[0]
    return (f"; {device} is still over: with mmap it maps the {o.span / GiB:.2f} GiB file span of its "
            f"{o.own / GiB:.2f} GiB of tensors, the CPU's between them included; without mmap "
            f"({' '.join(plan.dialect.no_mmap_flags)}) it holds only its tensors (Fastest plan tries both)")


def _fill_refused_text(projection: Projection, device: str, plan: Plan) -> str:
    """Why Fill moved nothing where ``device`` maps the file (Metal with mmap) and is over: whatever routed
    experts it moves, the span of its other tensors keeps it over (core.presets.fill_with_experts makes
    no plan that is over there); "" otherwise."""
    from offload_planner.core.device_figures import DeviceFigures
    from offload_planner.core.mapped_span import mapped_span, mapping_gpus
    from offload_planner.core.units import GiB

    dm = projection.device(device)
    if device not in mapping_gpus(plan) or not DeviceFigures.of(dm).over:
        return ""
    span, _ = mapped_span(dm)
    return (f"Fill moved nothing: {device} stays over whatever routed experts it moves: with mmap it maps "
            f"the {span / GiB:.2f} GiB file span from its first tensor to its last, and experts inside the "
            f"span of its other tensors free nothing when moved off; without mmap "
            f"({' '.join(plan.dialect.no_mmap_flags)}) it holds only its tensors (Fastest plan tries both)")


def _unmapped_text(before: Plan, after: Plan) -> str:
    """", loaded without mmap (-lm none): ..." where the search turned mmap off because a GPU maps the file
    (Metal: its mapped span held the CPU's tensors); "" otherwise (every plan without such a GPU)."""
    from offload_planner.core.mapped_span import mapping_gpus, unmapped_flags

    gpus = mapping_gpus(before)
    flags = unmapped_flags(after)
    if not gpus or not flags:
        return ""
    return (f", loaded without mmap ({flags}): {', '.join(gpus)} then holds only its tensors, not the file "
            "span of them with the CPU's between")


def _top_layers_text(before: Plan, after: Plan) -> str:
    """", -ngl 68 with mmap: ..." where the search took the top layers because a GPU maps the file (Metal:
    the last layers and the output lie together at the file's end, so the mapped span holds only the
    GPU's tensors); "" otherwise."""
    from offload_planner.core.mapped_span import mapping_gpus

    gpus = mapping_gpus(after)
    n = after.placement_options.n_gpu_layers
    if not gpus or n == before.placement_options.n_gpu_layers:
        return ""
    return (f", -ngl {n} with mmap: the top {n} layers (the output counted as one) on {', '.join(gpus)}, "
            "whose mapped file span then holds only its tensors")


def _ram_hint(plan: Plan, why: str, machine_ram: int | None) -> str:
    """Where the RAM is over and it is this machine's (``machine_ram``: not declared with --device, nor
    typed in the Size column): `gui --device CUDA0=rtx3090` on the demo was told "Nothing fits these
    devices: CPU (RAM) over by 337.1 GiB (... > 23.5 GiB)" and not that the RAM can be set, as `fit`
    says (cli_fit.ram_hint)."""
    cpu = plan.devices.cpu
    if "CPU (RAM) over" not in why or cpu.source == "declared" or cpu.total is None:
        return ""
    if machine_ram is None or cpu.total != machine_ram:
        return ""
    return (f". The RAM is this machine's ({cpu.total / 1024**3:.1f} GiB): to plan for another machine, type "
            "its size in the CPU row's Size column (or start with --device CPU=512GiB,ram=8xDDR5-4800)")


def _held_by_rules(plan: Plan) -> str:
    """What the search left alone because the command's own ``-ot`` rules place it ("" if nothing):
    the search keeps every rule of the user's, so ``-ot exps=CPU`` keeps the experts on the CPU
    however much room the GPUs have."""
    text = presets.held_by_rules_text(plan)
    return f"; {text}" if text else ""


def _speed_change(before: Plan, after: Plan, over: list[str] | None = None) -> str:
    """"est. tg 0.532 → 0.573 t/s (+7.7%), pp 24 → 102 t/s (+325%); ": the speed line's figures
    before and after ("" when the estimate fails: the message goes without it).  ``over``: devices
    the plan before could not hold; then only the new figures, since a change against a plan
    llama-server would not load ("29.2 → 0.577 t/s (−98%)" on the demo's -ngl 999) reads as a loss."""
    from offload_planner.backend.speed_store import plan_speed
    from offload_planner.ui.rates import change_text, rate_text

    try:
        a, b = plan_speed(before, probe=False), plan_speed(after, probe=False)
    except Exception:  # the estimate is a hint here: the preset's message goes without it
        return ""
    if over:
        return (f"est. tg {rate_text(b.tg_tps)} t/s, pp {rate_text(b.pp_tps)} t/s (the plan before did "
                f"not fit {', '.join(over)}: no speed to compare with); ")
    return (f"est. tg {rate_text(a.tg_tps)} → {rate_text(b.tg_tps)} t/s ({change_text(a.tg_tps, b.tg_tps)}), "
            f"pp {rate_text(a.pp_tps)} → {rate_text(b.pp_tps)} t/s ({change_text(a.pp_tps, b.pp_tps)})"
            f"{_request_change(a, b)}; ")


def _request_change(a: SpeedEstimate, b: SpeedEstimate) -> str:
    """", ranked by a request (a 4096-token prompt and a 512-token answer): 299 → 173 s" where tg or pp
    got slower ("" where both gained): the search ranks by a request's seconds (fit's --goal balanced),
    and "tg 3.10 → 3.09 t/s (−0.5%)" alone read as a Fastest plan that made the answer slower."""
    from offload_planner.core.speed.ranking import BALANCED_ANSWER

    if b.tg_tps >= a.tg_tps and b.pp_tps >= a.pp_tps:
        return ""

    def seconds(e: SpeedEstimate) -> str:
        return f"{e.prompt / e.pp_tps + BALANCED_ANSWER / e.tg_tps:.4g}"

    return (f", ranked by a request (a {b.prompt}-token prompt and a {BALANCED_ANSWER}-token answer): "
            f"{seconds(a)} → {seconds(b)} s")


def _moved_count(plan: Plan) -> int:
    """Tensors the plan places off its command's own placement: the map's corner marks (the plan's
    moves also name tensors the command's flags, such as --cpu-moe, put there anyway)."""
    base = {p.tensor.name: p.device for p in plan.base_placement().items if not p.copy}
    return sum(1 for p in plan.placement().items if not p.copy and p.device != base.get(p.tensor.name))


def fastest_plan(plan: Plan, goal: str = "balanced", *, allow_kv_quant: bool = False,
                 allow_nkvo: bool = False) -> FastestResult:
    """The fastest plan that fits every device, RAM included (core.speed.fastest), from this plan, on
    the devices' declared figures and this machine's cached RAM probe: its ``best`` with its full
    projection, None when nothing fits (``why`` says which device, by how much).
    ``allow_kv_quant``: the KV cache may become q8_0; ``allow_nkvo``: it may go to RAM (-nkvo)."""
    from offload_planner.backend.speed_store import efficiencies_for, machine_hardware
    from offload_planner.core.speed.fastest import fastest_from_plan

    # the figures the window's own estimate uses (-t, -tb, the cores, cached RPC links, local CPU backends)
    hw = machine_hardware(plan, probe=False)
    result = fastest_from_plan(plan, hw, goal=goal, eff=efficiencies_for(plan.dialect, plan.devices),
                               allow_kv_quant=allow_kv_quant, allow_nkvo=allow_nkvo)
    return result
