"""Tensor data that is not laid out as gguf.cpp requires (each tensor's data right after the one before
it in the order of the infos, padded to the alignment): llama.cpp refuses the file ("tensor '...' has
offset X, expected Y"); the reader planned it."""

from __future__ import annotations

from pathlib import Path

from tests.core.test_reader_bad_input import F32_T, Raw, _expect, tinfo

from offload_planner.core.gguf_reader import open_model


def test_a_gap_between_tensors_is_refused(tmp_path: Path) -> None:
    raw = Raw(data_bytes=512)
    raw.infos[2] = tinfo("output_norm.weight", [32], F32_T, 384)  # 352 expected (aligned, no overlap)
    _expect(raw.write(tmp_path / "gap.gguf"), "has data offset 384, where llama.cpp expects 352",
            raw.info_pos(2))


def test_infos_in_another_order_than_the_data_are_refused(tmp_path: Path) -> None:
    raw = Raw()
    raw.infos = [raw.infos[1], raw.infos[0], raw.infos[2]]
    _expect(raw.write(tmp_path / "order.gguf"), "'blk.0.attn_q.weight' has data offset 256, where llama.cpp "
            "expects 0", raw.info_pos(0))


def test_the_resources_and_the_plain_layout_still_open(tmp_path: Path) -> None:
    assert len(open_model(Raw().write(tmp_path / "ok.gguf")).tensors) == 3
    for path in sorted((Path(__file__).resolve().parents[2] / "resources").glob("*.gguf")):
        assert open_model(path).tensors, path


def test_the_pinned_llama_server_refuses_the_gap_too(tmp_path: Path, llama_server: Path) -> None:
    import subprocess

    from tests.support.procs import free_port

    raw = Raw(data_bytes=512)
    raw.infos[2] = tinfo("output_norm.weight", [32], F32_T, 384)
    path = raw.write(tmp_path / "gap.gguf")
    r = subprocess.run([str(llama_server), "-m", str(path), "--port", str(free_port())], capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    said = r.stderr + r.stdout
    assert r.returncode != 0 and "tensor 'output_norm.weight' has offset 384, expected 352" in said
