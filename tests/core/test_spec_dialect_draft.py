"""What each dialect's llama-server does with ``-md`` and no ``--spec-type``, read from its source:
the pinned llama.cpp loads the draft and generates without it; ik_llama.cpp (from PR 1949,
2026-06-12) drops it before loading (``common_speculative_prepare_startup`` clears a draft no stage
needs); 2025 mainline builds draft with it."""

from __future__ import annotations

from pathlib import Path

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.dialects import IK, IK_2025, IK_AMB256, LLAMA_CPP, LLAMA_CPP_2025, Dialect
from offload_planner.core.engine import placement_options
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.speculative import SpecSettings, spec_settings

GiB = 1024**3


def _spec(small_models: dict[str, Path], dialect: Dialect) -> SpecSettings:
    draft = str(small_models["llama-draft"])
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), ())
    parsed = parse_server_args(["-c", "1024", "-md", draft])  # -md as the pinned parser reads it
    return spec_settings(devices, parsed, dialect, placement_options, open_model(draft))


def test_md_alone_per_dialect(small_models: dict[str, Path]) -> None:
    pinned = _spec(small_models, LLAMA_CPP)
    assert pinned.draft is not None and not pinned.drafting  # loaded (its memory projected), not drafted
    older = _spec(small_models, LLAMA_CPP_2025)
    assert older.draft is not None and older.drafting
    for ik in (IK, IK_AMB256, IK_2025):  # not loaded at all (and ik builds before PR 645 had no drafting)
        got = _spec(small_models, ik)
        assert ik.draft_needs_spec_type and got.draft is None and not got.active, ik


def test_draft_mtp_with_a_draft_without_nextn_layers_is_refused(small_models: dict[str, Path],
                                                               llama_server: Path, tmp_path: Path) -> None:
    """``-md`` of a file without NextN layers and ``--spec-type draft-mtp``: the server creates the MTP
    context on the draft model, which llama_init_from_model refuses, and exits; the planner says so
    (it counted the draft as loaded and not drafted with)."""
    from tests.support.procs import free_port, run_to_completion

    from offload_planner.core.analysis import analyse_command

    argv = ["-c", "1024", "-md", str(small_models["llama-draft"]), "--spec-type", "draft-mtp", "-fit", "off"]
    code, out = run_to_completion([llama_server, "-m", small_models["llama"], *argv, "--host", "127.0.0.1",
                                   "--port", str(free_port()), "--no-warmup"], log_path=tmp_path / "srv.log")
    assert code != 0 and "failed to create MTP context" in out, out[-2000:]
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), ())
    result = analyse_command(open_model(small_models["llama"]), devices, parse_server_args(argv))
    assert any("llama-server exits at load" in w and "failed to create MTP context" in w
               and "the draft model has no NextN layers" in w for w in result.warnings), result.warnings
