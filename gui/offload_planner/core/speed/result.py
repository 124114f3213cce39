"""What a speed estimate answers (:func:`core.speed.estimate.estimate`): tokens per second, the
figures of each device, the bottlenecks and the assumptions they rest on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from offload_planner.core.speed.hardware import Figure

if TYPE_CHECKING:
    from offload_planner.core.speed.slots import SlotsEstimate
    from offload_planner.core.speed.speculation import SpecEstimate


@dataclass(frozen=True)
class Assumption:
    what: str
    figure: Figure

    def text(self) -> str:
        return f"{self.what}: {self.figure.describe()}"

    def as_json(self) -> dict[str, object]:
        f = self.figure
        return {"what": self.what, "value": f.value, "unit": f.unit, "source": str(f.source), "note": f.note}


@dataclass
class DeviceTime:
    name: str
    bytes_per_token: int  # at depth 0 (weights only)
    kv_bytes_at_ctx: int  # KV cache read per token at the full context
    tg_ms_per_token: float  # at depth 0
    tg_ms_at_ctx: float
    pp_ms: float = 0.0  # of the whole prompt: compute / reads on this device
    share: float = 0.0  # of the time per token at depth 0
    pp_reads_ms: float = 0.0  # of pp_ms: a CPU's weight and KV reads, added to its compute


@dataclass
class SpeedEstimate:
    tg_tps: float
    tg_tps_at_ctx: float
    pp_tps: float
    prompt: int
    n_ctx: int  # the depth of tg_tps_at_ctx
    n_ubatch: int
    devices: list[DeviceTime]
    n_splits: int
    split_ms: float  # per generated token
    pp_transfer_ms: float  # op offload copies over the whole prompt
    pp_split_ms: float
    op_offload: bool  # the micro-batch reaches the op-offload batch
    bottleneck: str
    pp_bottleneck: str
    calibrated: bool
    assumptions: list[Assumption] = field(default_factory=list)
    spec: SpecEstimate | None = None  # tg_tps/tg_tps_at_ctx are with it (core.speed.speculation)
    depth: int = 0  # --depth: the context before the prompt (0: pp from an empty cache)
    pp_tps_at_depth: float | None = None  # the prompt after ``depth`` tokens (depth > 0)
    tg_tps_at_depth: float | None = None  # a token after ``depth`` tokens (depth > 0)
    warnings: list[str] = field(default_factory=list)  # e.g. more compute threads than cores
    host_kv_layers: int = 0  # -nkvo: GPU layers whose KV cache and attention ops are on the CPU
    host_kv_ms: float = 0.0  # their round trips a token (in n_splits, not in split_ms)
    bottleneck_at_ctx: str = ""  # of tg_tps_at_ctx
    slots: SlotsEstimate | None = None  # -np N > 1: every slot generating at once (core.speed.slots)

    def device(self, name: str) -> DeviceTime:
        return next(d for d in self.devices if d.name == name)
