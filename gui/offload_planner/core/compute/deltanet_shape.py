"""What the gated-delta-net graphs (:mod:`.archs_deltanet`) need of a hybrid model beyond the
attention shape: the delta net's hyper-parameters and which layers are recurrent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from offload_planner.core.model import Model

#: The hybrid architectures whose trunk mixes gated-delta-net (recurrent) and gated full-attention
#: layers (``src/models/qwen3next.cpp``, ``qwen35.cpp``, ``qwen35moe.cpp``).
DELTA_NET_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe"})
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


def recurrent_layers(model: Model, n_trunk: int) -> tuple[bool, ...]:
    """``is_recr_impl`` as ``load_arch_hparams`` fills it: ``attention.recurrent_layers`` (one value or
    one per layer), else every layer but each ``full_attention_interval``-th (default 4)."""
    n_all = model.summary.n_layer
    key = f"{model.arch}.attention.recurrent_layers"
    if key in model.metadata:
        v = model.meta.per_layer(key, 0, n_all)
        flags = [bool(x) for x in v] if isinstance(v, list) else [bool(v)] * n_all
        return tuple(flags[:n_trunk])
    interval = model.arch_int("full_attention_interval", 4)
    if interval == 0:
        raise ValueError(f"{model.arch}.full_attention_interval is 0")
    return tuple((il + 1) % interval != 0 for il in range(n_trunk))


def delta_net_shape(model: Model) -> DeltaNet | None:
    """The delta net of a hybrid model (None for other architectures)."""
    if model.arch not in DELTA_NET_ARCHS:
        return None
    n_trunk = model.summary.n_layer_trunk
    return DeltaNet(
        d_conv=model.arch_int("ssm.conv_kernel", 0), d_inner=model.arch_int("ssm.inner_size", 0),
        d_state=model.arch_int("ssm.state_size", 0), n_group=model.arch_int("ssm.group_count", 0),
        dt_rank=model.arch_int("ssm.time_step_rank", 0), recurrent=recurrent_layers(model, n_trunk))
