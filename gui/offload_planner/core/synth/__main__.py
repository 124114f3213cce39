"""``python -m offload_planner.core.synth OUTDIR [--only NAME ...] [--header-only] [--split N]``.

Writes the catalog's models into OUTDIR: small models complete (``<name>.gguf``), big models
header-only (``<name>.header.gguf``).  ``--header-only`` makes every file header-only;
``--full-big`` writes big models complete (sparse files of their real apparent size).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from offload_planner.core.synth.catalog import BIG_MODELS, all_models
from offload_planner.core.synth.writer import write_model


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m offload_planner.core.synth", description=__doc__)
    p.add_argument("outdir", type=Path)
    p.add_argument("--only", nargs="+", metavar="NAME", help="model names (default: all)")
    p.add_argument("--header-only", action="store_true", help="write headers only")
    p.add_argument("--full-big", action="store_true", help="write big models complete (sparse)")
    p.add_argument("--split", type=int, default=None, metavar="N", help="max tensors per shard")
    p.add_argument("--list", action="store_true", help="list model names and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    models = all_models()
    if args.list:
        for name in models:
            print(name)
        return 0
    names = args.only or list(models)
    unknown = [n for n in names if n not in models]
    if unknown:
        print(f"unknown model(s): {', '.join(unknown)}; try --list", file=sys.stderr)
        return 2
    for name in names:
        header_only = args.header_only or (name in BIG_MODELS and not args.full_big)
        path = args.outdir / f"{name}{'.header' if header_only else ''}.gguf"
        t0 = time.perf_counter()
        paths = write_model(
            models[name], path, header_only=header_only, split_max_tensors=args.split
        )
        dt = time.perf_counter() - t0
        for p in paths:
            print(f"{p}  {p.stat().st_size:,} bytes  ({dt:.2f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
