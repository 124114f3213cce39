"""Fill a written model's tensor data with random, well-formed values (for speed measurements).

:func:`~offload_planner.core.synth.writer.write_model` leaves tensor data as a sparse run of zeros:
right for memory projections, wrong for timing, because the kernel's page cache serves zero pages
without reading RAM and a zero-filled file has no real bytes to stream.  :func:`fill_random`
writes every tensor's bytes in place: random quants in every block, with the block's scale fields
(``d``/``dmin`` f16, MXFP4's e8m0 exponent) set to small finite values so the weights are
well-formed numbers of the magnitude a trained model has, and never Inf or NaN.

Supported types: f32, f16, q8_0, q4_K, q5_K, q6_K, mxfp4 (what the catalogue's quant mixes use).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Tensor

CHUNK_BYTES = 32 << 20

Filler = Callable[[np.random.Generator, int], bytes]


def _f32(rng: np.random.Generator, n_blocks: int) -> bytes:
    return rng.normal(0.0, 0.02, n_blocks).astype("<f4").tobytes()


def _f16(rng: np.random.Generator, n_blocks: int) -> bytes:
    return rng.normal(0.0, 0.02, n_blocks).astype("<f2").tobytes()


def _blocks(rng: np.random.Generator, n_blocks: int, size: int,
            scales: tuple[tuple[int, float, float], ...]) -> bytes:
    """Random bytes in ``n_blocks`` blocks of ``size`` bytes, each f16 at (offset, lo, hi) set finite."""
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for off, lo, hi in scales:
        d = rng.uniform(lo, hi, n_blocks).astype("<f2")
        raw[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw.tobytes()


def _q8_0(rng: np.random.Generator, n: int) -> bytes:  # d f16, qs[32]
    return _blocks(rng, n, 34, ((0, 1e-4, 3e-4),))


def _q4_k(rng: np.random.Generator, n: int) -> bytes:  # d, dmin f16, scales[12], qs[128]
    return _blocks(rng, n, 144, ((0, 1e-5, 3e-5), (2, 1e-5, 3e-5)))


def _q5_k(rng: np.random.Generator, n: int) -> bytes:  # d, dmin f16, scales[12], qh[32], qs[128]
    return _blocks(rng, n, 176, ((0, 1e-5, 3e-5), (2, 1e-5, 3e-5)))


def _q6_k(rng: np.random.Generator, n: int) -> bytes:  # ql[128], qh[64], scales[16] i8, d f16
    return _blocks(rng, n, 210, ((208, 1e-5, 3e-5),))


def _mxfp4(rng: np.random.Generator, n: int) -> bytes:  # e8m0 exponent, qs[16]
    raw = rng.integers(0, 256, (n, 17), dtype=np.uint8)
    raw[:, 0] = rng.integers(118, 124, n, dtype=np.uint8)  # 2^-9 .. 2^-4
    return raw.tobytes()


# ggml type name -> (elements per block, bytes per block, filler)
FILLERS: dict[str, tuple[int, int, Filler]] = {
    "f32": (1, 4, _f32),
    "f16": (1, 2, _f16),
    "q8_0": (32, 34, _q8_0),
    "q4_K": (256, 144, _q4_k),
    "q5_K": (256, 176, _q5_k),
    "q6_K": (256, 210, _q6_k),
    "mxfp4": (32, 17, _mxfp4),
}


def _fill_tensor(f: object, t: Tensor, rng: np.random.Generator) -> None:
    try:
        _, block_bytes, fill = FILLERS[t.type.name]
    except KeyError:
        raise ValueError(f"{t.name}: cannot fill type {t.type.name} with random values") from None
    n_blocks = t.nbytes // block_bytes
    per_chunk = max(1, CHUNK_BYTES // block_bytes)
    f.seek(t.offset)  # type: ignore[attr-defined]
    done = 0
    while done < n_blocks:
        k = min(per_chunk, n_blocks - done)
        f.write(fill(rng, k))  # type: ignore[attr-defined]
        done += k


def fill_random(paths: list[Path], seed: int = 0) -> int:
    """Write random well-formed data into every tensor of the model in ``paths``; returns bytes written."""
    model = open_model(str(paths[0]))
    rng = np.random.default_rng(seed)
    written = 0
    files = [open(model.shards[i].path, "r+b") for i in range(len(model.shards))]  # noqa: SIM115
    try:
        for t in model.tensors:
            _fill_tensor(files[t.shard], t, rng)
            written += t.nbytes
    finally:
        for f in files:
            f.close()
    return written
