"""Mainline llama.cpp before b6050 (up to July 2025): the public CUDA logs of b4343-b5622.

What differs from the 2025 builds after it (:mod:`mainline_2025`), from the pull requests that changed it:

- ``-ot ...=CPU`` takes the plain CPU buffer type (``CPU``, ``CPU_Mapped`` with mmap); from b6050 (PR
  14990, August 2025) the CPU list's first type, the GPU's host buffer (``CUDA_Host``).  The public logs
  of b5192/b5274 show it: the token embedding alone in ``CUDA_Host`` (630.59 MiB), the overridden FFN in
  ``CPU``;
- K and V are stored with ``ggml_cpy`` into views of the cache (no K/V index inputs): ``ggml_set_rows``
  (PR 14285, June 2025) was used only with ``LLAMA_SET_ROWS=1`` until PR 14959 made it the default
  (August 2025);
- gptneox conts each of its fused Q/K/V views (``ggml_cont(ggml_view_2d(...))``, as ik_llama.cpp's copy of
  that graph still does; the b4343 CI logs of Pythia match it to the 0.01 MiB: CUDA0 162.00, host 9.01);
- no ``-ngl`` means no layer offloaded (the b5269 log without ``-ngl``: every layer on the CPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from offload_planner.core.dialects.base import register
from offload_planner.core.dialects.mainline_2025 import Mainline2025

if TYPE_CHECKING:
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.placement import PlacementOptions


class Mainline2025Early(Mainline2025):
    plain_cpu_overrides = True
    copies_kv_into_views = True
    detect_rank = 90  # never recognised from a server's output (its help looks like 2025's): picked by name
    help_markers: tuple[str, ...] = ()
    version_markers: tuple[str, ...] = ()

    def default_ngl(self, ngl: Any, has_gpu: bool) -> Any:
        return 0 if ngl is None else ngl

    def notes(self, popts: PlacementOptions, devices: DeviceSet) -> list[str]:
        return []  # the -ot ...=CPU rule of these builds is the one projected


LLAMA_CPP_2025_EARLY = register(
    Mainline2025Early("llama.cpp-2025-early", "llama.cpp (builds before b6050, July 2025)"),
    "LLAMA_CPP_2025_EARLY")
