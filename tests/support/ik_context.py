"""ik_llama.cpp's own figures for a model and context settings, from its libllama (CPU build).

There is no ik server binary on PyPI, but the ik-llama-cpp-python wheel ships ik's libllama.
:func:`measure` loads a model with it in a child process (a library abort kills the child, not
pytest; ik and mainline ggml never share a process) with the MLA mode as a model parameter, as
ik's server passes it, then creates one context per setting and keeps what ik logs and reports:

* ``llama_model_size`` (Σ ggml_nbytes of the model's tensors, including those ik computes at load)
* ``llm_load_tensors: CPU buffer size = X MiB`` (the weights buffer)
* ``llama_kv_cache_init: CPU KV buffer size = X MiB``
* ``llama_init_from_model: CPU  output buffer size = X MiB`` and ``... compute buffer size``
* refusals: the text ik printed before it failed (``V cache quantization requires flash_attn``,
  or the abort of an incompatible DeepSeek file).

    python ik_context.py OUT.json MODEL MLA SETTINGS_JSON MODEL_PARAMS_JSON
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from offload_planner.backend import child_guard

WEIGHTS_LINE = re.compile(r"^llm_load_tensors:\s+(\S+) buffer size =\s+([0-9.]+) MiB$")
KV_LINE = re.compile(r"^llama_kv_cache_init:\s+(\S+) KV buffer size =\s+([0-9.]+) MiB$")
OUTPUT_LINE = re.compile(r"^llama_init_from_model:\s+(\S+)\s+output buffer size =\s+([0-9.]+) MiB$")
COMPUTE_LINE = re.compile(r"^llama_init_from_model:\s+(\S+) compute buffer size =\s+([0-9.]+) MiB$")


@dataclass(frozen=True)
class ContextReport:
    settings: dict[str, Any]
    created: bool
    lines: list[str] = field(repr=False)

    def _mib(self, pattern: re.Pattern[str]) -> dict[str, float]:
        return {m.group(1): float(m.group(2)) for line in self.lines if (m := pattern.match(line))}

    @property
    def kv_mib(self) -> dict[str, float]:
        return self._mib(KV_LINE)

    @property
    def output_mib(self) -> dict[str, float]:
        return self._mib(OUTPUT_LINE)

    @property
    def compute_mib(self) -> dict[str, float]:
        return self._mib(COMPUTE_LINE)


@dataclass(frozen=True)
class ModelReport:
    path: str
    mla: int
    loaded: bool
    model_size: int
    load_lines: list[str] = field(repr=False)
    contexts: list[ContextReport] = field(repr=False)
    stdout: str = field(default="", repr=False)  # printf output (ik's computed tensors, aborts)

    @property
    def weights_mib(self) -> dict[str, float]:
        return {m.group(1): float(m.group(2)) for line in self.load_lines if (m := WEIGHTS_LINE.match(line))}


def measure(model: Path, mla: int, settings: Sequence[Mapping[str, Any]],
            timeout: float = 600, model_params: Mapping[str, Any] | None = None) -> ModelReport:
    """Load ``model`` with ik's libllama (``mla`` as the model parameter, mmap on, CPU only, and
    ``model_params``: further ``llama_model_params`` field values, e.g. ``{"mtp": True}``) and
    create a context for each ``settings`` dict of ``llama_context_params`` field values."""
    with tempfile.TemporaryDirectory(prefix="ik-ctx-") as tmp:
        out = Path(tmp) / "out.json"
        r = child_guard.run(
            [sys.executable, str(Path(__file__).resolve()), str(out), str(model), str(mla),
             json.dumps(list(settings)), json.dumps(dict(model_params or {}))],
            timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "2"},
        )
        if not out.exists():  # the library aborted: keep what it printed
            return ModelReport(str(model), mla, False, 0, [], [], r.stdout + r.stderr)
        d = json.loads(out.read_text(encoding="utf-8"))
    return ModelReport(
        d["path"], mla, d["loaded"], d["model_size"], d["load_lines"],
        [ContextReport(c["settings"], c["created"], c["lines"]) for c in d["contexts"]],
        r.stdout,
    )


def _lines(raw: list[tuple[int, str]]) -> list[str]:
    return "".join(text for _, text in raw).splitlines()


def _child(out: str, path: str, mla: int, settings: list[dict[str, Any]],
           model_params: dict[str, Any]) -> int:
    from ik_tools import open_ik_with_log  # run as a script: this directory is on sys.path

    C, raw, _callback = open_ik_with_log()
    lib = C._lib

    mp = C.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.use_mmap = True
    mp.mla = mla
    for k, v in model_params.items():
        setattr(mp, k, v.encode() if isinstance(v, str) else v)  # a char * (devices)
    model = C.llama_model_load_from_file(path.encode(), mp)
    sys.stdout.flush()
    result: dict[str, Any] = {"path": path, "loaded": bool(model), "model_size": 0,
                              "load_lines": _lines(raw), "contexts": []}
    if model:
        result["model_size"] = int(lib.llama_model_size(model))
        for s in settings:
            raw.clear()
            cp = C.llama_context_default_params()
            cp.mla_attn = mla
            cp.n_threads = cp.n_threads_batch = 2
            for k, v in s.items():
                setattr(cp, k, v)
            ctx = C.llama_init_from_model(model, cp)
            result["contexts"].append({"settings": s, "created": bool(ctx), "lines": _lines(raw)})
            if ctx:
                C.llama_free(ctx)
        C.llama_free_model(model)
    Path(out).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 6:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(_child(sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]),
                    json.loads(sys.argv[5])))
