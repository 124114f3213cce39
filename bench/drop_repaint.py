"""Drop to repaint: from dropping one layer's routed experts on CPU to the memory bars repainted.

Offscreen Qt, the DeepSeek-V3 demo header, CUDA0 + CUDA1 (24 GiB) and CPU. Each run moves one
layer's experts (a real PlanDocument.move, one undo step) and repaints the memory view; the bars
show the new weights at once, the compute buffers follow from the background simulation. Printed
beside the time of that full analysis. Target: drop to repaint under 50 ms.

    python bench/drop_repaint.py [--runs 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

from PySide6.QtCore import QEventLoop, QTimer
from PySide6.QtWidgets import QApplication

from offload_planner.cli import demo_model_path
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.ui.document import PlanDocument
from offload_planner.ui.memory_view import MemoryView

GIB = 1024**3


def _wait_current(app: QApplication, doc: PlanDocument, timeout_s: float = 30) -> float:
    t0 = time.perf_counter()
    while not doc.analysis_current:
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError("the analysis did not arrive")
        loop = QEventLoop()
        QTimer.singleShot(1, loop.quit)
        loop.exec()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    app = QApplication.instance() or QApplication([])
    model = open_model(demo_model_path())
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GIB, 480 * GIB),
                        tuple(Device(f"CUDA{i}", DeviceKind.CUDA, 24 * GIB, 23 * GIB) for i in range(2)))
    plan = plan_from_args(model, devices, parse_server_args(["-ngl", "999", "-ts", "1,1", "-c", "32768"]))
    doc = PlanDocument()
    view = MemoryView(doc)
    view.resize(300, 500)
    view.show()
    doc.reset(plan)
    _wait_current(app, doc)
    layers = range(model.summary.n_layer_dense_lead, model.summary.n_layer)
    exps = {il: [t.name for t in model.tensors if t.layer == il and t.role.is_routed_expert] for il in layers}
    drops, fulls = [], []
    for i in range(args.runs):
        il = list(layers)[(i // 2) % len(exps)]  # a layer's experts to CPU, then back
        before = doc.analysis
        t0 = time.perf_counter()
        doc.move(exps[il], "CPU" if i % 2 == 0 else None)
        view.repaint()
        drops.append(time.perf_counter() - t0)
        assert doc.analysis is not before, "the bars did not get a new projection"
        fulls.append(drops[-1] + _wait_current(app, doc))
    d, f = statistics.median(drops) * 1000, statistics.median(fulls) * 1000
    print(f"DeepSeek-V3 header, {len(model.tensors)} tensors, CUDA0/CUDA1/CPU, {args.runs} drops")
    print(f"drop to repaint (weights/KV/output current)   : median {d:7.1f} ms (target < 50 ms)")
    print(f"drop to full analysis (compute simulated too) : median {f:7.1f} ms")
    print(f"ratio full / repaint                          : {f / d:7.1f}x")
    doc.shutdown()


if __name__ == "__main__":
    main()
