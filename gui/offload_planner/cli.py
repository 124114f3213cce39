"""Headless entry point: ``offload-planner inspect MODEL``; the same core as the GUI."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from offload_planner import __version__
from offload_planner.core.errors import PlannerError


def demo_model_path() -> Path:
    """The bundled header-only DeepSeek-V3 Q4_K_M (from a checkout or an installed wheel)."""
    from offload_planner.resources import resource_path

    return resource_path("DeepSeek-V3-Q4_K_M.header.gguf")


def _cmd_inspect(args: argparse.Namespace) -> int:
    from offload_planner.core.gguf_reader import open_model
    from offload_planner.core.inspect_report import model_json, text_report

    model = open_model(args.model or demo_model_path())
    if args.json:
        json.dump(model_json(model), sys.stdout, indent=None if args.compact else 1)
        sys.stdout.write("\n")
    else:
        print(text_report(model, layers=not args.no_layers))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="offload-planner",
        description="Plan how llama.cpp / ik_llama.cpp place a GGUF model's tensors across CPU "
        "RAM and GPUs, project every device's memory, and export the command line.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    ins = sub.add_parser(
        "inspect",
        help="summarise a GGUF model (file, any shard of a split model, header-only file or URL)",
        description="Read a GGUF header (never the tensor data) and print the model's shape, "
        "quant types and a per-layer table of bytes by role. MODEL may be a local file, any "
        "shard of a split model, a header-only file, or an http(s) URL (only the header is "
        "downloaded, with HTTP Range requests). Without MODEL, the bundled demo model is used.",
    )
    ins.add_argument("model", nargs="?", help="GGUF path or URL (default: bundled demo model)")
    ins.add_argument("--json", action="store_true", help="print one JSON object (schema: README)")
    ins.add_argument("--compact", action="store_true", help="with --json: no indentation")
    ins.add_argument("--no-layers", action="store_true", help="omit the per-layer table")
    ins.set_defaults(func=_cmd_inspect)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        code: int = args.func(args)
        return code
    except PlannerError as e:
        print(f"offload-planner: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
