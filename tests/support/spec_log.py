"""A llama-server log with speculative decoding, split into the main context and the draft/MTP one.

The server creates the draft (or MTP) context after the main one; ``common_speculative_init_result``
logs where it starts.  Everything after that line belongs to the extra context.  Its compute buffers
are reserved more than once (``llama_set_embeddings_nextn`` re-reserves the MTP scheduler, which
grows the same buffers): per buffer the largest reserve is what stays allocated.
"""

from __future__ import annotations

from collections import defaultdict

from offload_planner.backend.log_parser import device_of_buffer, parse_log

SPEC_START = "common_speculative_init_result"
Totals = dict[str, dict[str, float]]  # device -> kind -> MiB


def split_log(lines: list[str], resolve: dict[str, str]) -> tuple[Totals, Totals]:
    """(main, extra) MiB per device and kind; ``resolve`` maps RPC endpoints to device names."""
    cut = next((i for i, line in enumerate(lines) if SPEC_START in line), len(lines))
    main = parse_log(lines[:cut]).by_device(resolve)
    per_buffer: dict[tuple[str, str], float] = defaultdict(float)
    for b in parse_log(lines[cut:]).buffers:
        key = (b.buffer, b.kind)
        per_buffer[key] = max(per_buffer[key], b.mib) if b.kind == "compute" else per_buffer[key] + b.mib
    extra: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (buffer, kind), mib in per_buffer.items():
        extra[device_of_buffer(buffer, resolve)][kind] += mib
    return main, {d: dict(k) for d, k in extra.items()}
