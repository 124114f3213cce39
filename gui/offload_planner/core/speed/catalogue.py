"""Known accelerators: vendor spec-sheet figures, each card naming the spec page it comes from.

Figures: memory bandwidth (GB/s, 10^9 bytes), host link (PCIe generation and lanes), dense FP16
tensor throughput (TFLOPS, the vendor's dense figure; for GeForce cards the FP16-accumulate one,
half the sparse headline), memory (GiB).  ``None`` where the vendor publishes no such figure (Apple
lists no TFLOPS for M3/M4; a Mac's memory depends on its configuration): the estimate then uses a
default and says so.  Cards whose figures were not certain are left out rather than guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Card:
    key: str  # what --device takes: rtx3090, h100-sxm, m2ultra
    name: str
    vram_gib: float | None
    bandwidth_gbs: float
    pcie: tuple[int, int] | None  # (generation, lanes); None: unified memory (no host copy)
    tflops: float | None
    source: str
    kind: str = "CUDA"  # device kind a catalogue name fits (CUDA, ROCm, Metal)


def _nv(key: str, name: str, vram: float, bw: float, pcie: tuple[int, int], tf: float | None,
        src: str) -> Card:
    return Card(key, name, vram, bw, pcie, tf, src)


CARDS: tuple[Card, ...] = (
    # GeForce GTX 16 (Turing without tensor cores)
    _nv("gtx1660super", "NVIDIA GeForce GTX 1660 SUPER", 6, 336, (3, 16), None,
        "guru3d GTX 1660 SUPER review, GPU specifications (TU116, 14 Gbps GDDR6 on a 192-bit bus: 336 GB/s); "
        "TechPowerUp GTX 1660 review (TU116: PCI-Express 3.0 x16, no tensor cores: no tensor TFLOPS)"),
    # GeForce RTX 20 (Turing)
    _nv("rtx2080ti", "NVIDIA GeForce RTX 2080 Ti", 11, 616, (3, 16), 107.6,
        "NVIDIA Turing GPU architecture whitepaper (GeForce RTX 2080 Ti, reference clocks)"),
    _nv("titanrtx", "NVIDIA TITAN RTX", 24, 672, (3, 16), 130,
        "NVIDIA TITAN RTX specifications"),
    # GeForce RTX 30 (Ampere)
    _nv("rtx3060", "NVIDIA GeForce RTX 3060", 12, 360, (4, 16), None,
        "NVIDIA GeForce RTX 3060 specifications (12 GB; no tensor TFLOPS figure listed there)"),
    _nv("rtx3070", "NVIDIA GeForce RTX 3070", 8, 448, (4, 16), 81.3,
        "NVIDIA Ampere GA102 GPU architecture whitepaper (GeForce RTX 3070 appendix)"),
    _nv("rtx3080", "NVIDIA GeForce RTX 3080", 10, 760, (4, 16), 119,
        "NVIDIA Ampere GA102 GPU architecture whitepaper (GeForce RTX 3080)"),
    _nv("rtx3080ti", "NVIDIA GeForce RTX 3080 Ti", 12, 912, (4, 16), 136.4,
        "NVIDIA GeForce RTX 3080 Ti specifications"),
    _nv("rtx3090", "NVIDIA GeForce RTX 3090", 24, 936, (4, 16), 142,
        "NVIDIA Ampere GA102 GPU architecture whitepaper (GeForce RTX 3090)"),
    _nv("rtx3090ti", "NVIDIA GeForce RTX 3090 Ti", 24, 1008, (4, 16), 160,
        "NVIDIA GeForce RTX 3090 Ti specifications"),
    # GeForce RTX 40 (Ada)
    _nv("rtx4060ti-16gb", "NVIDIA GeForce RTX 4060 Ti 16GB", 16, 288, (4, 8), None,
        "NVIDIA GeForce RTX 4060 Ti specifications (16 GB, PCIe 4.0 x8; no tensor TFLOPS figure listed)"),
    _nv("rtx4080", "NVIDIA GeForce RTX 4080", 16, 716.8, (4, 16), 194.9,
        "NVIDIA Ada GPU architecture whitepaper (GeForce RTX 4080)"),
    _nv("rtx4090", "NVIDIA GeForce RTX 4090", 24, 1008, (4, 16), 330.3,
        "NVIDIA Ada GPU architecture whitepaper (GeForce RTX 4090)"),
    # GeForce RTX 50 (Blackwell)
    _nv("rtx5090", "NVIDIA GeForce RTX 5090", 32, 1792, (5, 16), 419,
        "NVIDIA GeForce RTX 5090 specifications (FP16 tensor 838 TFLOPS sparse)"),
    # RTX workstation
    _nv("rtxa4000", "NVIDIA RTX A4000", 16, 448, (4, 16), 76.7,
        "NVIDIA RTX A4000 datasheet (tensor performance 153.4 TFLOPS sparse)"),
    _nv("rtxa5000", "NVIDIA RTX A5000", 24, 768, (4, 16), 111.1,
        "NVIDIA RTX A5000 datasheet (tensor performance 222.2 TFLOPS sparse)"),
    _nv("rtxa6000", "NVIDIA RTX A6000", 48, 768, (4, 16), 154.8,
        "NVIDIA RTX A6000 datasheet (tensor performance 309.7 TFLOPS sparse)"),
    _nv("rtxpro6000", "NVIDIA RTX PRO 6000 Blackwell", 96, 1792, (5, 16), 500,
        "NVIDIA RTX PRO 6000 Blackwell (GTC 2025): 4,000 AI TOPS (FP4, sparse) and 125 TFLOPS FP32, as "
        "reported at https://www.topcpu.net/es/news/nvidia-launches-96gb-rtx-5090-model-with-a-whopping-"
        "price-tag-of-10000; no FP16 tensor figure listed: dense FP16 = FP4 sparse / 8, the Blackwell ratio "
        "of the GeForce RTX 5090's own figures (3,352 AI TOPS, 419 TFLOPS dense FP16)"),
    # data centre
    _nv("l4", "NVIDIA L4", 24, 300, (4, 16), 121,
        "NVIDIA L4 Tensor Core GPU datasheet (FP16 tensor 242 TFLOPS sparse)"),
    _nv("l40s", "NVIDIA L40S", 48, 864, (4, 16), 362.05,
        "NVIDIA L40S datasheet"),
    _nv("a100-40gb", "NVIDIA A100 40GB PCIe", 40, 1555, (4, 16), 312,
        "NVIDIA A100 Tensor Core GPU datasheet (A100 40GB PCIe)"),
    _nv("a100-80gb", "NVIDIA A100 80GB SXM", 80, 2039, (4, 16), 312,
        "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM)"),
    _nv("a100-80gb-pcie", "NVIDIA A100 80GB PCIe", 80, 1935, (4, 16), 312,
        "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB PCIe)"),
    _nv("h100-pcie", "NVIDIA H100 PCIe", 80, 2000, (5, 16), 756.5,
        "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe, FP16 tensor 1513 TFLOPS sparse)"),
    _nv("h100-sxm", "NVIDIA H100 SXM", 80, 3350, (5, 16), 989.5,
        "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM, FP16 tensor 1979 TFLOPS sparse)"),
    _nv("h200", "NVIDIA H200 SXM", 141, 4800, (5, 16), 989.5,
        "NVIDIA H200 Tensor Core GPU datasheet (FP16 tensor 1979 TFLOPS sparse)"),
    # NVIDIA GB10 (DGX Spark): CPU and GPU share 128 GB of LPDDR5x (no PCIe copy to the GPU).  NVIDIA
    # lists no FP16 figure; its FP4 figure / 8 (the Blackwell ratio of the RTX 5090's own figures) is a
    # nominal 125 TFLOPS, which the GB10 does not sustain.  Measured:
    # - 8-bit and 4-bit tensor GEMMs at 71-75% of nominal: "FP8 | Peak (large GEMM) | 188" TFLOPS (of 250)
    #   and "356 TFLOPS on dense NVFP4 = ~71% utilization of the 500 TFLOPS dense FP4 peak" (CUTLASS 4.4
    #   kernels for sm_121, https://forums.developer.nvidia.com/t/sm121-cutlass-kernel-optimization-results-
    #   nvfp4-356-tflops-moe-grouped-gemm-on-dgx-spark/359960);
    # - 16-bit GEMMs at about half of nominal: "The equivalent BF16 performance settles around 60 TFLOPS"
    #   (https://www.banandre.com/blog/2025-10/dgx-spark-underperformance-claims-vs-reality-in-ai-hardware,
    #   John Carmack's and Awni Hannun's tests of October 2025), Carmack's unit "only drawing approximately
    #   100 watts ... roughly half of Nvidia's quoted performance figures" (digitaltechexplorer.com,
    #   /john-carmack-alleges-nvidia-dgx-sparks-thermal-issues-halve-ai-performance-threatening-laptop-apu-
    #   prospects).
    # llama.cpp's prompt path multiplies quantized weights with 8-bit integer MMA (MMQ,
    # ggml-cuda/mmq.cu: every quantized type on Turing and later), so the figure is the measured 8-bit
    # GEMM rate in FP16 units: 188 / 2 = 94 (the nominal 8-bit rate being twice the FP16 one).  The other
    # cards keep their nominal figures (whether they sustain them is not checked).  With it and a CUDA
    # GPU's matrix efficiency flat past 512 tokens in mainline (core.speed.efficiency.gpu_rows_max_gain),
    # llama.cpp's own GB10 runs (benches/dgx-spark/dgx-spark.md, build 7941) are estimated within
    # the spread of the other cards (tests/core/test_speed_public.py prints them).
    Card("gb10", "NVIDIA GB10", 119.2, 273, None, 94,
         "NVIDIA DGX Spark: 128 GB LPDDR5x unified memory, 273 GB/s (NVIDIA DGX Spark product page and "
         "hardware guide, as quoted at https://ai-infrastructure.net/dgx-spark/); no FP16 tensor figure "
         "listed (1 PFLOP FP4 with sparsity, NVIDIA at Hot Chips 2025, as reported at "
         "https://afnnews.qaasid.com/145463: a nominal 125 dense FP16); 94 = the measured 8-bit GEMM rate, "
         "'FP8 | Peak (large GEMM) | 188' TFLOPS (https://forums.developer.nvidia.com/t/sm121-cutlass-kernel-"
         "optimization-results-nvfp4-356-tflops-moe-grouped-gemm-on-dgx-spark/359960), / 2"),
    # AMD
    Card("rx7900xtx", "AMD Radeon RX 7900 XTX", 24, 960, (4, 16), 122.8,
         "AMD Radeon RX 7900 XTX specifications (peak half precision 122.8 TFLOPS)", "ROCm"),
    Card("mi300x", "AMD Instinct MI300X", 192, 5300, (5, 16), 1307.4,
         "AMD Instinct MI300X data sheet", "ROCm"),
    # Apple (unified memory: the size depends on the machine, give it: MTL0=m2ultra,192GiB; kind Metal)
    Card("m1max", "Apple M1 Max", None, 400, None, None, "Apple M1 Max: up to 400GB/s memory bandwidth "
         "(Apple newsroom, Introducing M1 Pro and M1 Max)", "Metal"),
    Card("m1ultra", "Apple M1 Ultra", None, 800, None, None, "Apple M1 Ultra: 800GB/s memory bandwidth "
         "(Apple newsroom, Apple unveils M1 Ultra)", "Metal"),
    Card("m2max", "Apple M2 Max", None, 400, None, None, "Apple M2 Max: 400GB/s memory bandwidth "
         "(Apple MacBook Pro technical specifications)", "Metal"),
    Card("m2ultra", "Apple M2 Ultra", None, 800, None, None, "Apple M2 Ultra: 800GB/s memory bandwidth "
         "(Apple newsroom, Apple introduces M2 Ultra)", "Metal"),
    Card("m3max", "Apple M3 Max (40-core GPU)", None, 400, None, None, "Apple M3 Max: 400GB/s memory "
         "bandwidth (Apple MacBook Pro technical specifications)", "Metal"),
    Card("m3ultra", "Apple M3 Ultra", None, 819, None, None, "Apple M3 Ultra: 819GB/s memory bandwidth "
         "(Apple Mac Studio technical specifications)", "Metal"),
    Card("m5", "Apple M5", None, 153, None, None, "Apple M5: 153GB/s unified memory bandwidth "
         "(Apple newsroom, Apple unveils M5, October 2025)", "Metal"),
    Card("m4max", "Apple M4 Max (40-core GPU)", None, 546, None, None, "Apple M4 Max: 546GB/s memory "
         "bandwidth (Apple MacBook Pro technical specifications)", "Metal"),
)

_BY_KEY = {c.key: c for c in CARDS}


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


_BY_NORM = {_norm(c.key): c for c in CARDS}
_BY_NAME: dict[str, Card] = {}  # each card's name with and without its vendor, the first card's
for _c in CARDS:
    for _n in (_c.name, _c.name.removeprefix("NVIDIA ").removeprefix("AMD ")):
        _BY_NAME.setdefault(_norm(_n), _c)


def card(text: str) -> Card | None:
    """The card a --device value or a driver's device name names: ``rtx3090``, ``RTX-3090``,
    ``NVIDIA GeForce RTX 3090`` (exact after dropping case and punctuation; no fuzzy guess)."""
    n = _norm(text)
    return _BY_NORM.get(n) or _BY_NAME.get(n)


def card_keys() -> list[str]:
    return [c.key for c in CARDS]
