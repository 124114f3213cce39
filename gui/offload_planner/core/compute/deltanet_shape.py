"""What the gated-delta-net graphs (:mod:`.archs_deltanet`) need of a hybrid model beyond the
attention shape: the delta net's hyper-parameters and which layers are recurrent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from offload_planner.core.recurrent_state import hybrid_arch, recurrent_layers

if TYPE_CHECKING:
    from offload_planner.core.memory import ContextParams
    from offload_planner.core.model import Model

#: The hybrid architectures whose trunk mixes gated-delta-net (recurrent) and gated full-attention
#: layers (``src/models/qwen3next.cpp``, ``qwen35.cpp``, ``qwen35moe.cpp``).
DELTA_NET_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe", "qwen4exp"})
#: Those whose attention rope is IMRoPE: ``inp_pos`` holds 4 positions per token (``n_pos_per_embd``).
MROPE_ARCHS = frozenset({"qwen35", "qwen35moe"})


@dataclass(frozen=True)
class DeltaNet:
    """``hparams.ssm_*`` and ``is_recr`` of one hybrid model (trunk layers)."""

    d_conv: int  # ssm.conv_kernel
    d_inner: int  # ssm.inner_size
    d_state: int  # ssm.state_size: the key head size (and the value head size)
    n_group: int  # ssm.group_count: key heads
    dt_rank: int  # ssm.time_step_rank: value heads
    recurrent: tuple[bool, ...]  # per trunk layer
    n_rs_seq: int  # rollback snapshots per sequence (speculative drafts that roll the state back)

    @property
    def conv_channels(self) -> int:
        return self.d_inner + 2 * self.n_group * self.d_state

    @property
    def n_embd_r(self) -> int:
        """``hparams.n_embd_r()``: a sequence's conv state (the last d_conv - 1 inputs)."""
        return (self.d_conv - 1) * self.conv_channels

    @property
    def n_embd_s(self) -> int:
        """``hparams.n_embd_s()``: a sequence's delta-net state."""
        return self.d_state * self.d_inner


def delta_net_shape(model: Model, p: ContextParams) -> DeltaNet | None:
    """The delta net of a hybrid model (None for other architectures); ``n_rs_seq`` where the
    architecture keeps rollback snapshots (``llm_arch_supports_rs_rollback``), else 0."""
    h = hybrid_arch(model)
    if model.arch not in DELTA_NET_ARCHS or h is None:
        return None
    n_trunk = model.summary.n_layer_trunk
    return DeltaNet(
        d_conv=model.arch_int("ssm.conv_kernel", 0), d_inner=model.arch_int("ssm.inner_size", 0),
        d_state=model.arch_int("ssm.state_size", 0), n_group=model.arch_int("ssm.group_count", 0),
        dt_rank=model.arch_int("ssm.time_step_rank", 0), recurrent=recurrent_layers(model)[:n_trunk],
        n_rs_seq=p.n_rs_seq if h.rollback else 0)
