"""The projector's lines in a llama-server log (copied from the pinned server loading the project's
small Gemma 3 projector on RPC0): the clip parser and the general log parser read them apart from
the text model's buffers."""

from __future__ import annotations

from offload_planner.backend.clip_log import parse_clip_log
from offload_planner.backend.log_parser import parse_log

LOG = """\
0.00.074.147 I sched_reserve: RPC0[127.0.0.1:18941] compute buffer size =    14.56 MiB
0.00.074.218 I sched_reserve: RPC0[127.0.0.1:18942] compute buffer size =    18.07 MiB
0.00.074.244 I sched_reserve:        CPU compute buffer size =    17.11 MiB
0.00.083.537 I clip_ctx: CLIP using RPC0[127.0.0.1:18941] backend
0.00.084.554 I load_hparams: model size:         1.74 MiB
0.00.097.641 I reserve_compute_meta: RPC0[127.0.0.1:18941] compute buffer size =     1.06 MiB
0.00.097.675 I reserve_compute_meta:        CPU compute buffer size =     0.57 MiB
0.00.097.699 I reserve_compute_meta: graph splits = 1, nodes = 90
0.00.097.726 I warmup: flash attention is enabled
""".splitlines()


def test_clip_lines() -> None:
    c = parse_clip_log(LOG)
    assert (c.backend, c.model_mib, c.n_splits, c.n_nodes, c.flash_attn) == (
        "RPC0[127.0.0.1:18941]", 1.74, 1, 90, True)
    assert c.compute_mib == {"RPC0[127.0.0.1:18941]": 1.06, "CPU": 0.57}
    cpu = parse_clip_log(["0.00.046.154 I clip_ctx: CLIP using CPU backend"])
    assert cpu.backend == "CPU" and cpu.compute_mib == {}


def test_log_parser_files_the_projector_as_mmproj() -> None:
    rep = parse_log(LOG)
    by = rep.by_device({"127.0.0.1:18941": "RPC0", "127.0.0.1:18942": "RPC1"})
    assert by["RPC0"] == {"compute": 14.56, "mmproj": 1.74 + 1.06}
    assert by["RPC1"] == {"compute": 18.07}
    assert by["CPU"] == {"compute": 17.11, "mmproj": 0.57}
