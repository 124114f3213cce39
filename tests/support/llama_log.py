"""Parse what llama.cpp prints while loading a model (``-lv 4``; ``llama-fit-params`` needs ``-lv 5``).

Lines carry an optional ``M.SS.mmm.uuu L `` prefix (timestamp and level letter); both are ignored.
``print_info`` values of per-layer hyper-parameters are printed as one number when all layers
agree and as ``[a, b, ...]`` when they vary; :func:`per_layer_value` turns both into Python.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_PREFIX = r"^(?:\d+\.\d+\.\d+\.\d+ [A-Z] )?"
_META = re.compile(
    _PREFIX + r"llama_model_loader: loaded meta data with (\d+) key-value pairs and (\d+) tensors",
    re.MULTILINE,
)
_TYPE = re.compile(_PREFIX + r"llama_model_loader: - type\s+(\S+):\s+(\d+) tensors", re.MULTILINE)
_INFO = re.compile(_PREFIX + r"print_info: (\S[^=]*?)\s*= (.*?)\s*$", re.MULTILINE)
_SIZE = re.compile(r"^([\d.]+) (MiB|GiB) \(([\d.]+) BPW\)$")
_UNUSED = re.compile(r"model has unused tensor (\S+) \(size = (\d+) bytes\)")
# DEBUG level (-lv 5): one line per unit; unit n_layer is the output layer
_LAYER = re.compile(r"load_tensors: layer\s+(\d+) assigned to device (\S+), is_swa = (\d)")


@dataclass
class LoadInfo:
    n_kv: int
    n_tensors: int
    type_counts: dict[str, int]
    info: dict[str, str]  # print_info key -> value text (first occurrence)
    unused_tensors: dict[str, int] = field(default_factory=dict)
    layer_device: dict[int, str] = field(default_factory=dict)  # -lv 5 only
    layer_swa: dict[int, bool] = field(default_factory=dict)  # -lv 5 only

    def get_int(self, key: str) -> int:
        return int(self.info[key])

    def file_size(self) -> tuple[float, str]:
        """``print_info: file size`` as (value, "MiB" | "GiB")."""
        m = _SIZE.match(self.info["file size"])
        if not m:
            raise ValueError(f"unexpected file size line: {self.info['file size']!r}")
        return float(m.group(1)), m.group(2)


def per_layer_value(text: str) -> int | list[int]:
    """``"8"`` -> 8; ``"[8, 8, 4]"`` -> [8, 8, 4]."""
    text = text.strip()
    if text.startswith("["):
        return [int(x) for x in text.strip("[]").split(",") if x.strip()]
    return int(text)


def format_file_size(n_bytes: int) -> str:
    """How llama.cpp prints ``ml.n_bytes``: ``%.2f MiB`` below 1 GiB, else ``%.2f GiB``."""
    if n_bytes < 1024**3:
        return f"{n_bytes / 1024 / 1024:.2f} MiB"
    return f"{n_bytes / 1024 / 1024 / 1024:.2f} GiB"


def parse_load_info(text: str) -> LoadInfo:
    m = _META.search(text)
    if not m:
        raise ValueError("no 'llama_model_loader: loaded meta data' line in the output")
    info: dict[str, str] = {}
    for key, value in _INFO.findall(text):
        info.setdefault(key.strip(), value)
    return LoadInfo(
        n_kv=int(m.group(1)),
        n_tensors=int(m.group(2)),
        type_counts={t: int(n) for t, n in _TYPE.findall(text)},
        info=info,
        unused_tensors={name: int(size) for name, size in _UNUSED.findall(text)},
        layer_device={int(il): dev for il, dev, _ in _LAYER.findall(text)},
        layer_swa={int(il): swa == "1" for il, _, swa in _LAYER.findall(text)},
    )
