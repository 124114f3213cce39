"""The plans a model opens with in the window: llama-server's defaults with just ``-c``, or, for
the bundled demo, the Guide's first plan on demo hardware; and the one-line model summary."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.dialects import Dialect
from offload_planner.core.model import Model
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.plan_edits import with_option
from offload_planner.core.units import fmt_bytes

#: What the bundled demo opens on when no device is given with --device: hardware it fits on, and
#: the Guide's first plan (README: routed experts in RAM, the rest on the GPU).  The RAM's speed is
#: declared with it, as the README's commands do (8 channels of DDR5-4800): with this machine's RAM
#: probe the demo's 512 GiB of RAM read at a laptop's or a busy VM's rate (7.4 GB/s here: "est. tg
#: 0.532 t/s" for a machine that is not this one).
DEMO_HARDWARE = ("CUDA0=24GiB", "CPU=512GiB,ram=8xDDR5-4800")
DEMO_ARGS = ("-c", "32768", "-ngl", "999", "--cpu-moe")


def model_summary(model: Model) -> str:
    s = model.summary
    parts = [s.name or Path(model.path).name, s.arch, f"{s.n_layer} layers"]
    if s.n_nextn:
        parts[-1] += f" ({s.n_nextn} NextN)"
    if s.n_expert:
        parts.append(
            f"{s.n_expert} experts ({s.n_expert_used} used"
            + (f", {s.n_expert_shared} shared)" if s.n_expert_shared else ")")
        )
    parts += [
        s.file_type,
        fmt_bytes(s.total_bytes, precision=1),
        f"{s.n_tensors:,} tensors",
        f"trained ctx {s.n_ctx_train:,}",
    ]
    if s.header_only:
        parts.append("header only")
    return "   ·   ".join(p for p in parts if p)


def demo_devices(margin: int) -> DeviceSet:
    """:data:`DEMO_HARDWARE`, each device described as demo hardware."""
    devs = [replace(parse_device_decl(d), margin=margin) for d in DEMO_HARDWARE]
    devs = [replace(d, description="demo GPU" if d.is_gpu else "demo RAM") for d in devs]
    cpu = next(d for d in devs if not d.is_gpu)
    return DeviceSet(cpu, tuple(d for d in devs if d.is_gpu))


def demo_plan(model: Model, devices: DeviceSet, dialect: Dialect) -> Plan:
    """The Guide's first plan: ``-c 32768 -ngl 999 --cpu-moe``."""
    return plan_from_args(model, devices, parse_server_args(list(DEMO_ARGS), dialect=dialect), dialect)


def new_plan(model: Model, devices: DeviceSet, dialect: Dialect, default_ctx: int) -> Plan:
    """What llama-server does for this model with just ``-c``: every layer on the GPUs (if any)."""
    n_ctx = min(default_ctx, model.summary.n_ctx_train) if default_ctx else 0
    plan = plan_from_args(model, devices, argparse.Namespace(ctx_size=n_ctx), dialect)
    if not devices.gpus:  # keep "-ngl all" so that adding a GPU offloads, as the server would
        plan = with_option(plan, "placement.n_gpu_layers", model.summary.n_layer + 1)
    return plan
