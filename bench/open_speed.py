"""Open speed: our GGUF header reader against gguf.GGUFReader on the same DeepSeek-V3 header.

Writes the header-only DeepSeek-V3 671B Q4_K_M (1,086 tensors, 129,280-token vocabulary with
merges) with the project's own model factory, then times both readers in the same run and prints
the ratio. Target: at least 100x faster than gguf.GGUFReader, and under 150 ms.

    python bench/open_speed.py [--runs 20] [--reference-runs 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import gguf

from offload_planner.core.gguf_reader import open_model
from offload_planner.core.synth.catalog import BIG_MODELS
from offload_planner.core.synth.writer import write_model

MODEL = "DeepSeek-V3-Q4_K_M"


def _time(fn: object, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--reference-runs", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_model(BIG_MODELS[MODEL], Path(tmp) / f"{MODEL}.gguf", header_only=True)[0]
        size = path.stat().st_size
        model = open_model(path)
        # gguf.GGUFReader maps tensor data and cannot open a header-only file: extend it to its
        # full size as a sparse file (no disk used) so that both readers open the same bytes.
        sh = model.shards[0]
        with open(path, "r+b") as f:
            f.truncate(sh.data_offset + sh.data_bytes)
        n_vocab = model.summary.n_vocab
        print(
            f"{MODEL}: header {size / 2**20:.1f} MiB, {len(model.tensors)} tensors, vocab {n_vocab},"
            f" sparse file of {path.stat().st_size / 2**30:.1f} GiB"
        )
        ours = _time(lambda: open_model(path), args.runs)
        ref = _time(lambda: gguf.GGUFReader(str(path)), args.reference_runs)
    ours_med, ref_med = statistics.median(ours), statistics.median(ref)
    print(f"offload_planner open_model : median {ours_med * 1000:8.1f} ms over {args.runs} runs")
    print(f"gguf.GGUFReader            : median {ref_med * 1000:8.1f} ms over {args.reference_runs} runs")
    print(f"ratio (GGUFReader / ours)  : {ref_med / ours_med:8.1f}x   (target >= 100x, ours < 150 ms)")


if __name__ == "__main__":
    main()
