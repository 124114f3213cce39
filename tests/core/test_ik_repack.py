"""ik's -rtr (core/ik_repack.py): which host weights become types the CUDA backend cannot multiply, by
iqk_quantize.cpp's repack table (rows interleaved) and ggml-cuda.cu's supports_op list."""

from __future__ import annotations

from offload_planner.core.ik_repack import repacked_off_gpu


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
