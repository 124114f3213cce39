"""ik's -rtr (core/ik_repack.py): which host weights become types the CUDA backend cannot multiply, by
iqk_quantize.cpp's repack table (rows interleaved) and ggml-cuda.cu's supports_op list."""

from __future__ import annotations

from offload_planner.core.ik_repack import interleaved_off_gpu, repacked_off_gpu


def test_repacked_types_the_gpu_cannot_run() -> None:
    weights = [
        ("blk.0.ffn_down_exps.weight", (1536, 4096, 128), "q8_0"),  # -> q8_0_r8: refused
        ("blk.0.ffn_up_exps.weight", (4096, 1536, 128), "Q6_K"),  # -> q6_k_r4: refused
        ("blk.1.ffn_up_exps.weight", (4096, 1536, 128), "iq4_k"),  # -> iq4_k_r4: CUDA runs it
        ("blk.2.ffn_up_exps.weight", (4096, 1532, 128), "q8_0"),  # 1532 rows: not a multiple of 8
        ("blk.3.attn_q.weight", (4096, 4100), "q4_k"),  # 4100 = 4 x 1025: repacked (r4)
        ("token_embd.weight", (4096, 151936), "q8_0"),  # never repacked
        ("blk.0.ffn_gate_inp.weight", (4096, 128), "f32"),  # no repack for f32
    ]
    assert repacked_off_gpu(weights) == {"blk.0.ffn_down_exps.weight", "blk.0.ffn_up_exps.weight",
                                         "blk.3.attn_q.weight"}


def test_file_types_the_gpu_cannot_run() -> None:
    """A file's own row-interleaved types: ggml-cuda.cu's supports_op lists only the IQ*_K_R4 family (from PR
    461 of 2025-05-26); builds before it list none."""
    weights = [
        ("blk.3.ffn_up_exps.weight", (7168, 2048, 256), "iq4_k_r4"),  # CUDA runs it (PR 461)
        ("blk.3.ffn_down_exps.weight", (2048, 7168, 256), "iq5_ks_r4"),  # CUDA runs it (PR 462)
        ("blk.4.ffn_up_exps.weight", (7168, 2048, 256), "q4_k_r4"),  # no CUDA kernel: refused
        ("blk.4.ffn_down_exps.weight", (2048, 7168, 256), "q8_0_r8"),  # no CUDA kernel: refused
        ("blk.5.ffn_up_exps.weight", (7168, 2048, 256), "iq4_k"),  # not interleaved
        ("blk.5.ffn_down_exps.weight", (2048, 7168, 256), "q6_K"),  # not interleaved
    ]
    assert interleaved_off_gpu(weights) == {"blk.4.ffn_up_exps.weight", "blk.4.ffn_down_exps.weight"}
    assert interleaved_off_gpu(weights, cuda_multiplies_r4=False) == {
        "blk.3.ffn_up_exps.weight", "blk.3.ffn_down_exps.weight", "blk.4.ffn_up_exps.weight",
        "blk.4.ffn_down_exps.weight"}
