"""What qwen4exp's graph (:mod:`.archs_qwen4exp`) needs beyond the delta-net hybrid's shape: the
hyper-connection streams and the QSA k-pool indexer's sizes at reserve time.

``llama_memory_hybrid_idx_context``'s full-cache constructor (src/llama-memory-hybrid-idx.cpp 516-537),
the one ``graph_reserve`` builds with, sizes the k-pool for every pool the cache can hold:
``n_pool_real = size / kpool * n_seq_max`` (``size``: the indexer cache's cells per stream), every one
of them re-pooled (``n_new = n_pool_real``), and ``get_n_kpool()`` pads it past one unused pool to a
multiple of 64 (``kpool_pad``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from offload_planner.core.hybrid_indexer import INDEXER_ARCHS, head_size

if TYPE_CHECKING:
    from offload_planner.core.memory import ContextParams, ResolvedContext
    from offload_planner.core.model import Model


@dataclass(frozen=True)
class Qsa:
    """qwen4exp's ``dsv4_hc_mult`` and QSA indexer of one reserve (``kpool`` 0: dense attention)."""

    hc: int  # hyper_connection.count: residual streams
    idx_dim: int  # attention.indexer.key_length
    n_idx_head: int  # attention.indexer.head_count
    top_k: int  # attention.indexer.top_k
    kpool: int  # the non-zero compress ratio (0: no k-pool, dense attention)
    ratios: tuple[int, ...]  # attention.compress_ratios per layer (the NextN block's too)
    n_pool: int  # get_n_kpool(): kpool_pad(n_pool_real)
    n_new: int  # get_n_kpool_new(): n_pool_real (at least 1)
    ple_layers: tuple[int, ...] = ()  # ple.layers: the layers adding the PLE n-gram embedding
    ple_n_heads: int = 0  # (ple.ngram_size - 1) * ple.heads_per_ngram
    ple_head_dim: int = 0  # embedding_length_per_layer_input
    ple_kernel: int = 0  # ple.conv_kernel
    ple_ngram: int = 0  # ple.ngram_size: the conv's dilation

    @property
    def n_top_pool(self) -> int:
        return min(self.n_pool, self.top_k // self.kpool)

    @property
    def n_sel(self) -> int:
        """The top blocks plus the tail (``inp->n_sel``)."""
        return self.kpool * self.n_top_pool + self.kpool - 1


def kpool_pad(n_pool: int) -> int:
    """``kpool_pad``: the last padded pool is always unused."""
    return max(64, -(-(n_pool + 1) // 64) * 64)


def qsa_shape(model: Model, ctx: ResolvedContext, p: ContextParams) -> Qsa | None:
    """qwen4exp's hyper-connections and k-pool sizes (None for other architectures)."""
    if model.arch != "qwen4exp":
        return None
    raw = model.metadata.get("qwen4exp.attention.compress_ratios")
    n_all = model.summary.n_layer
    ratios = tuple(int(x) for x in raw)[:n_all] if isinstance(raw, (list, tuple)) else (0,) * n_all
    kpool = INDEXER_ARCHS["qwen4exp"].kpool(model) if head_size(model) else 0
    n_pool_real = ctx.n_ctx_seq // kpool * p.n_seq_max if kpool else 0
    ple = model.metadata.get("qwen4exp.ple.layers")
    ple_layers = tuple(int(x) for x in ple) if isinstance(ple, (list, tuple)) else ()
    ngram = model.arch_int("ple.ngram_size", 0) if ple_layers else 0
    return Qsa(hc=model.arch_int("hyper_connection.count", 1), idx_dim=head_size(model),
               n_idx_head=model.arch_int("attention.indexer.head_count", 0),
               top_k=model.arch_int("attention.indexer.top_k", 0), kpool=kpool, ratios=ratios,
               n_pool=kpool_pad(n_pool_real), n_new=max(n_pool_real, 1), ple_layers=ple_layers,
               ple_n_heads=(ngram - 1) * model.arch_int("ple.heads_per_ngram", 0) if ple_layers else 0,
               ple_head_dim=model.arch_int("embedding_length_per_layer_input", 0) if ple_layers else 0,
               ple_kernel=model.arch_int("ple.conv_kernel", 0) if ple_layers else 0, ple_ngram=ngram)
