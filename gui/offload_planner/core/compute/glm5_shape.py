"""What glm5-next's graph (:mod:`.archs_glm5_next`) needs of the model and context: its KDA layers (as a
:class:`DeltaNet` whose key groups are its heads: ``n_embd_r`` = 3 conv states, ``n_embd_s`` = a
``head_dim`` square per head), the mHC streams and the k-pool DSA indexer's reserve sizes
(``llama_memory_hybrid_idx``'s full-cache context, as :mod:`.qsa_shape`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from offload_planner.core.compute.deltanet_shape import DeltaNet
from offload_planner.core.compute.qsa_shape import kpool_pad
from offload_planner.core.hybrid_indexer import head_size
from offload_planner.core.recurrent_state import hybrid_arch, recurrent_layers

if TYPE_CHECKING:
    from offload_planner.core.memory import ContextParams, ResolvedContext
    from offload_planner.core.model import Model


@dataclass(frozen=True)
class Glm5:
    dn: DeltaNet
    hc: int
    idx_dim: int
    n_idx_head: int
    top_k: int
    kpool: int
    select_tail: bool
    indexer_full: tuple[bool, ...]
    n_pool: int
    n_new: int
    gather: bool  # n_ubatch <= 16 and n_ctx > top_k + kpool - 1: the gathered-latents path
    gate_lower_bound: bool  # kda.gate_lower_bound present: the sigmoid decay gate

    @property
    def n_top_pool(self) -> int:
        return min(self.n_pool, self.top_k // self.kpool)

    @property
    def n_sel(self) -> int:
        return self.kpool * self.n_top_pool + (self.kpool - 1 if self.select_tail else 0)


def glm5_shape(model: Model, ctx: ResolvedContext, p: ContextParams) -> Glm5 | None:
    h = hybrid_arch(model)
    if model.arch != "glm5-next" or h is None:
        return None
    n_trunk = model.summary.n_layer_trunk
    head, n_head = model.arch_int("kda.head_dim", 0), model.summary.n_head
    n_head = n_head if isinstance(n_head, int) else max(n_head)
    dn = DeltaNet(d_conv=model.arch_int("ssm.conv_kernel", 0), d_inner=head * n_head, d_state=head,
                  n_group=n_head, dt_rank=n_head, recurrent=recurrent_layers(model)[:n_trunk],
                  n_rs_seq=p.n_rs_seq if h.rollback else 0)
    kpool = model.arch_int("attention.indexer.kpool", 0)
    top_k = model.arch_int("attention.indexer.top_k", 0)
    types = model.metadata.get("glm5-next.attention.indexer.types")
    full = tuple(bool(x) for x in types)[:n_trunk] if isinstance(types, (list, tuple)) else (True,) * n_trunk
    n_pool_real = ctx.n_ctx_seq // kpool * p.n_seq_max if kpool else 0
    tail = model.metadata.get("glm5-next.attention.indexer.kpool_select_tail")
    return Glm5(dn=dn, hc=model.arch_int("hyper_connection.count", 4), idx_dim=head_size(model),
                n_idx_head=model.arch_int("attention.indexer.head_count", 0), top_k=top_k, kpool=kpool,
                select_tail=True if tail is None else bool(tail), indexer_full=full,
                n_pool=kpool_pad(n_pool_real), n_new=max(n_pool_real, 1),
                gather=ctx.n_ubatch <= 16 and ctx.n_ctx > top_k + kpool - 1,
                gate_lower_bound="glm5-next.kda.gate_lower_bound" in model.metadata)
