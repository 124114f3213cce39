"""A GGUF written again by gguf-py with one key dropped or changed, or one tensor renamed: real bytes
of a model llama.cpp refuses (tests/test_cli_unloadable.py, tests/ui/test_unloadable_window.py)."""

from __future__ import annotations

from pathlib import Path

import gguf


def rewrite(src: Path, dst: Path, *, drop: str = "", u32: tuple[str, int] | None = None,
            rename: tuple[str, str] | None = None, text: tuple[str, str] | None = None) -> Path:
    """``src`` written again by gguf-py's GGUFWriter, without the key ``drop``, with the uint32 key
    ``u32`` or the string key ``text`` set (appended after the others), or a tensor renamed; tensor
    data copied as is."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), str(r.fields["general.architecture"].contents()))
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", drop) or (u32 and name == u32[0]) \
                or (text and name == text[0]):
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        else:
            w.add_key_value(name, f.contents(), f.types[0])
    if u32 is not None:
        w.add_uint32(*u32)
    if text is not None:
        w.add_string(*text)
    names = dict([rename]) if rename else {}
    for t in r.tensors:
        w.add_tensor(names.get(t.name, t.name), t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
