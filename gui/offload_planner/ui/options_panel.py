"""OPTIONS: the llama-server flags that change memory: -c, -b, -ub, -fa, -ctk/-ctv, -np/-kvu, -ngl,
mmap, KV offload; ik_llama.cpp's -mla for DeepSeek-style models. The widgets mirror the plan; every
change is one SetOption undo step (repeated changes of one option merge)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtGui import QIntValidator, QValidator
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLayout,
    QLineEdit,
    QSpinBox,
    QWidget,
)

from offload_planner.core.cmdline.handlers_mainline import INT_MAX
from offload_planner.core.kv_override import file_model, overridable_experts
from offload_planner.core.plan import Plan
from offload_planner.core.plan_edits import EXPERTS_USED, option_value
from offload_planner.ui.document import PlanDocument

MLA_MODES = ((0, "0: standard cache"), (1, "1: c^KV + kv^T"), (2, "2: c^KV"), (3, "3: c^KV (ik default)"))
KV_TYPES = ("f16", "bf16", "f32", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
CONTEXTS = (2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
BATCHES = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


UNIFIED_TIP = "-kvu: the slots share one KV cache"


def mmap_tip(no_mmap: tuple[str, ...]) -> str:
    """The mmap box's tooltip in the build's own spelling: it said "-lm none (--no-mmap)" for every
    build, where the pinned build refuses --no-mmap and ik and the 2025 builds have no -lm."""
    return f"off: {' '.join(no_mmap)}: CPU weights in a CPU buffer instead of the file map"
UNIFIED_SINGLE_TIP = "-kvu: not in ik_llama.cpp, which keeps one KV stream (its server refuses the flag)"


class _NglSpinBox(QSpinBox):
    """-ngl: 0..L+1, the maximum shown as "all"."""

    def textFromValue(self, value: int) -> str:
        return f"all ({value})" if value == self.maximum() and value > 0 else str(value)

    def valueFromText(self, text: str) -> int:
        t = text.strip().lower()
        if t.startswith("all") or t == "auto":
            return self.maximum()
        try:
            return int(t)
        except ValueError:
            return self.value()

    def validate(self, text: str, pos: int) -> Any:
        t = text.strip().lower()
        if t.startswith("all"):
            return QValidator.State.Acceptable
        if t and "all".startswith(t):
            return QValidator.State.Intermediate
        return super().validate(text, pos)


def _line_edit(c: QComboBox) -> QLineEdit:
    edit = c.lineEdit()
    assert edit is not None, "an editable combo box"
    return edit


def _int_combo(values: tuple[int, ...], *, special: str = "") -> QComboBox:
    c = QComboBox()
    c.setEditable(True)
    c.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
    if special:
        c.addItem(special, 0)
    for v in values:
        c.addItem(str(v), v)
    if not special:
        _line_edit(c).setValidator(QIntValidator(0, 1 << 24, c))
    return c


def _combo_value(c: QComboBox) -> int | None:
    text = c.currentText().strip()
    i = c.findText(text)
    if i >= 0 and isinstance(c.itemData(i), int):
        return int(c.itemData(i))
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


BATCH, UB = "context.n_batch", "context.n_ubatch"

#: Why the window takes no -b 0 (llama.cpp makes it n_batch = n_ubatch = 0: no prompt can be processed).
NO_BATCH = ("-b 0 is not taken: llama.cpp would make its batch and micro-batch 0 tokens and process no "
            "prompt; Batch -b takes 1 or more")


class OptionsPanel(QWidget):
    message = Signal(str)  # an edit not taken, and why

    def __init__(self, doc: PlanDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = doc
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignRight)

        self.ctx = _int_combo(CONTEXTS, special="trained")
        self.batch = _int_combo(BATCHES)
        self.ubatch = _int_combo(BATCHES)
        self.ngl = _NglSpinBox()
        self.ngl.setKeyboardTracking(False)
        self.flash = QCheckBox("flash attention")
        self.type_k = QComboBox()
        self.type_v = QComboBox()
        for c in (self.type_k, self.type_v):
            c.addItems(KV_TYPES)
        self.slots = QSpinBox()
        self.slots.setRange(1, 256)
        self.slots.setKeyboardTracking(False)
        self.unified = QCheckBox("unified KV")
        self.mmap = QCheckBox("mmap the model")
        self.kv_offload = QCheckBox("KV cache on the layer's GPU")
        self.experts = QSpinBox()
        self.experts.setKeyboardTracking(False)
        self.experts.setAccessibleName("Experts a token")
        self.mla = QComboBox()
        for mode, text in MLA_MODES:
            self.mla.addItem(text, mode)
        self.mla.setToolTip("ik_llama.cpp -mla: how a DeepSeek-style model keeps its KV cache and which "
                            "attention tensors ik computes at load (not 1: attn_kv_b, about 1 GiB for "
                            "DeepSeek-V3)")
        self.mla.setAccessibleName("MLA mode")

        self.ctx.setToolTip(
            "-c: context size (trained = the model's trained length; pin it to stop --fit from shrinking it)"
        )
        self.batch.setToolTip("-b: logical batch size: the most prompt tokens llama-server takes in one "
                              "step, computed -ub tokens at a time")
        self.ubatch.setToolTip("-ub: physical batch size (micro-batch): the prompt tokens computed at once. "
                               "Larger is faster on long prompts and grows the compute buffers (GPU "
                               "memory); the Speed tab plots the trade-off")
        self.ngl.setToolTip("-ngl: layers offloaded to the GPUs, counted from the output end (all: every "
                            "layer; the routed experts can still go to the CPU, see Presets)")
        self.flash.setToolTip("-fa on|off: flash attention (a quantized V cache needs it)")
        self.type_k.setToolTip("-ctk: K cache type: what the K half of the KV cache is stored as (f16; "
                               "q8_0 takes about half the memory)")
        self.type_v.setToolTip("-ctv: V cache type: what the V half of the KV cache is stored as (f16; "
                               "q8_0 takes about half the memory, with flash attention on)")
        self.slots.setToolTip("-np: parallel slots: how many requests llama-server serves at once; they "
                              "share the context (-c) between them")
        self.unified.setToolTip(UNIFIED_TIP)
        self.mmap.setToolTip(mmap_tip(("-lm", "none")))  # the pinned build's until a plan says its build
        self.kv_offload.setToolTip("off: -nkvo: the KV cache stays in system RAM")

        form.addRow("Context", self.ctx)
        form.addRow("Batch -b", self.batch)
        form.addRow("µbatch -ub", self.ubatch)
        form.addRow("GPU layers", self.ngl)
        kv = QHBoxLayout()  # K and V on one row: the column must fit 1280x800 without squeezing
        kv.addWidget(self.type_k, 1)
        v_label = QLabel("V")
        v_label.setBuddy(self.type_v)
        kv.addWidget(v_label)
        kv.addWidget(self.type_v, 1)
        self.type_k.setAccessibleName("K cache type")
        self.type_v.setAccessibleName("V cache type")
        form.addRow("KV cache K", kv)
        slots = QHBoxLayout()  # the experts beside the slots: a row more made the left column scroll
        for box in (self.slots, self.experts):  # their hints (room for "256", "256/256") widened the column
            box.setMinimumWidth(48)
        slots.addWidget(self.slots, 1)
        self._experts_label = QLabel("Experts")
        self._experts_label.setBuddy(self.experts)
        slots.addWidget(self._experts_label)
        slots.addWidget(self.experts, 1)
        form.addRow("Slots -np", slots)
        form.addRow("MLA -mla", self.mla)
        self._form = form
        self._label_tips(((self.ctx, self.ctx), (self.batch, self.batch), (self.ubatch, self.ubatch),
                          (self.ngl, self.ngl), (kv, self.type_k), (slots, self.slots),
                          (self.mla, self.mla)))
        v_label.setToolTip(self.type_v.toolTip())
        checks = QGridLayout()
        checks.setContentsMargins(0, 0, 0, 0)
        checks.addWidget(self.unified, 0, 0)
        checks.addWidget(self.flash, 0, 1)
        checks.addWidget(self.kv_offload, 1, 0, 1, 2)
        checks.addWidget(self.mmap, 2, 0, 1, 2)
        form.addRow(checks)

        self._bind_combo(self.ctx, "context.n_ctx", "context size")
        self._bind_combo(self.batch, "context.n_batch", "-b")
        self._bind_combo(self.ubatch, "context.n_ubatch", "-ub")
        self.ngl.valueChanged.connect(lambda v: self._set("placement.n_gpu_layers", v, "-ngl"))
        self.flash.toggled.connect(lambda v: self._set("context.flash_attn", v, "flash attention"))
        self.type_k.currentTextChanged.connect(lambda v: self._set("context.type_k", v, "K cache type"))
        self.type_v.currentTextChanged.connect(lambda v: self._set("context.type_v", v, "V cache type"))
        self.slots.valueChanged.connect(lambda v: self._set("context.n_seq_max", v, "-np"))
        self.unified.toggled.connect(lambda v: self._set("context.kv_unified", v, "unified KV"))
        self.mmap.toggled.connect(lambda v: self._set("placement.use_mmap", v, "mmap"))
        self.kv_offload.toggled.connect(lambda v: self._set("context.offload_kqv", v, "KV offload"))
        self.mla.activated.connect(lambda i: self._set("context.mla", int(self.mla.itemData(i)), "-mla"))
        self.experts.valueChanged.connect(lambda v: self._set(EXPERTS_USED, v, "experts a token"))

        doc.planChanged.connect(self.sync)
        doc.modelChanged.connect(self.sync)
        self.sync()

    def _label_tips(self, rows: tuple[tuple[QWidget | QLayout, QWidget], ...]) -> None:
        """Each row's label says what its field's tooltip says: hovering "µbatch -ub" or "Slots -np"
        explains them, not only hovering the field."""
        for field, tipped in rows:
            label = self._form.labelForField(field)
            if label is not None:
                label.setToolTip(tipped.toolTip())

    def _bind_combo(self, c: QComboBox, key: str, label: str) -> None:
        def commit() -> None:
            v = _combo_value(c)
            if v == 0 and key == "context.n_batch":  # -c 0 (trained) and -ub 0 (= -b) mean something
                self.message.emit(NO_BATCH)
                v = None
            if v is not None and key in (UB, BATCH) and self._doc.has_plan:
                self._set_batches(key, v)
            elif v is not None:
                self._set(key, v, label)
            else:
                self.sync()

        c.activated.connect(lambda _i: commit())
        _line_edit(c).editingFinished.connect(commit)

    def _set_batches(self, key: str, value: int) -> None:
        """-b or -ub, the other one following where llama.cpp would cut -ub to -b (n_ubatch = min(n_batch,
        n_ubatch)): -ub 4096 under -b 2048 showed 4096 here and ran 2048 (the Speed tab's "fastest at -ub
        4096" is at -b 4096 too, as Fastest plan sets both). Both in one undo step, and said."""
        plan = self._doc.plan
        flag = "-ub" if key == UB else "-b"
        if key == UB and value > int(option_value(plan, BATCH)):
            other, text = BATCH, f"Batch -b raised to {value} with it"
        elif key == BATCH and value < int(option_value(plan, UB)):
            other, text = UB, f"µbatch -ub lowered to {value} with it"
        else:
            self._set(key, value, flag)
            return
        self._doc.set_options({key: value, other: value}, f"Set {flag} to {value} ({text.split()[1]} too)")
        self.message.emit(f"{text}: llama.cpp computes at most -b tokens at once (a -ub above -b is cut "
                          "to -b)")

    def _set(self, key: str, value: object, label: str) -> None:
        if self._doc.has_plan:
            self._doc.set_option(key, value, label)

    def sync(self) -> None:
        """Show the plan's values (without emitting edits)."""
        widgets: list[QWidget] = [
            self.ctx,
            self.batch,
            self.ubatch,
            self.ngl,
            self.flash,
            self.type_k,
            self.type_v,
            self.slots,
            self.unified,
            self.mmap,
            self.kv_offload,
            self.mla,
            self.experts,
        ]
        has = self._doc.has_plan
        for w in widgets:
            w.setEnabled(has)
        if not has:
            return
        plan = self._doc.plan
        blockers = [QSignalBlocker(w) for w in widgets]
        blockers.append(QSignalBlocker(_line_edit(self.ctx)))
        trained = plan.model.summary.n_ctx_train
        self.ctx.setItemText(0, f"trained ({trained})")
        self.ctx.setItemData(0, 0)
        self._show_int(self.ctx, int(option_value(plan, "context.n_ctx")))
        self._show_int(self.batch, int(option_value(plan, "context.n_batch")))
        self._show_int(self.ubatch, int(option_value(plan, "context.n_ubatch")))
        self.ngl.setRange(0, plan.model.summary.n_layer + 1)
        self.ngl.setValue(min(int(option_value(plan, "placement.n_gpu_layers")), self.ngl.maximum()))
        self.flash.setChecked(bool(option_value(plan, "context.flash_attn")))
        self.type_k.setCurrentText(str(option_value(plan, "context.type_k")))
        self.type_v.setCurrentText(str(option_value(plan, "context.type_v")))
        # the build's LLAMA_MAX_SEQ (pinned: 256); ik checks none: what a plan file takes (core.plan_file)
        self.slots.setMaximum(plan.dialect.max_seq or INT_MAX)
        self.slots.setValue(int(option_value(plan, "context.n_seq_max")))
        self.unified.setChecked(bool(option_value(plan, "context.kv_unified")))
        self.mmap.setChecked(bool(option_value(plan, "placement.use_mmap")))
        self.kv_offload.setChecked(bool(option_value(plan, "context.offload_kqv")))
        self.mla.setCurrentIndex(max(0, self.mla.findData(int(option_value(plan, "context.mla")))))
        self._form.setRowVisible(self.mla, plan.dialect.takes_mla(plan.model))
        self._sync_experts(plan)
        # ik has one KV stream and refuses -kvu: ticked there, the box exported a command ik refuses
        single = plan.dialect.single_kv_stream
        self.unified.setEnabled(not single)
        self.unified.setToolTip(UNIFIED_SINGLE_TIP if single else UNIFIED_TIP)
        self.mmap.setToolTip(mmap_tip(plan.dialect.no_mmap_flags))
        del blockers

    def _sync_experts(self, plan: Plan) -> None:
        """The experts each token runs, for a MoE model whose file holds the count as one number (the
        only form ``--override-kv`` replaces: core.kv_override); 1 to all of them."""
        model = file_model(plan.model)
        s = model.summary
        shown = s.n_expert > 0 and overridable_experts(model)
        self.experts.setVisible(shown)
        self._experts_label.setVisible(shown)
        if not shown:
            return
        self.experts.setRange(1, s.n_expert)
        self.experts.setValue(plan.model.summary.n_expert_used)
        self.experts.setSuffix(f"/{s.n_expert}")
        tip = (f"--override-kv {model.arch}.expert_used_count=int:N: the routed experts each token runs "
               f"(the file: {s.n_expert_used}). Fewer read less per token (faster generation, less "
               "compute memory) and change the model's answers; llama.cpp applies it when it loads the "
               "model")
        self.experts.setToolTip(tip)
        self._experts_label.setToolTip(tip)

    @staticmethod
    def _show_int(c: QComboBox, value: int) -> None:
        i = c.findData(value)
        if i >= 0:
            c.setCurrentIndex(i)
        else:
            c.setEditText(str(value))
