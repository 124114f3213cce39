"""A tensor name with a NUL byte inside: gguf.cpp checks the length of the whole string, then gives ggml
the C string (``ggml_set_name(&info.t, name.c_str())``, the name ending at the first NUL) and checks
duplicates on that.  The planner kept the bytes after the NUL, and a plan of a mutated header wrote
them into an ``-ot`` rule that no command line can carry (the fuzz test's input 494)."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.core.errors import GGUFError
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.synth import SMALL_MODELS, write_model


def _renamed(tmp_path: Path, old: bytes, new: bytes) -> Path:
    """The small llama with tensor name ``old`` replaced by ``new`` (the same length: the layout holds)."""
    assert len(old) == len(new)
    path = write_model(SMALL_MODELS["llama"], tmp_path / "llama.gguf")[0]
    data = path.read_bytes()
    assert data.count(old) == 1
    path.write_bytes(data.replace(old, new))
    return path


def test_a_name_ends_at_its_nul_as_ggml_keeps_it(tmp_path: Path) -> None:
    path = _renamed(tmp_path, b"output_norm.weight", b"output_norm\0weight")
    names = {t.name for t in open_model(path).tensors}
    assert "output_norm" in names and not any("\0" in n for n in names)


def test_two_names_equal_up_to_their_nul_are_duplicates(tmp_path: Path) -> None:
    path = _renamed(tmp_path, b"blk.0.attn_k.weight", b"output_norm.weight\0")
    with pytest.raises(GGUFError, match=r"duplicate tensor name 'output_norm\.weight'"):
        open_model(path)
