"""One entry opens a model the way llama.cpp loads it: :func:`core.loadable.open_loadable` (read, then
refused where llama.cpp refuses it).  ``plan``, ``fit``, ``launch``, a plan file's model, the ``-md``
draft and the window's loader each repeated ``require_loadable(open_model(x))`` (the window in two
steps); now they call it, and the refusals read as before (tests/test_cli_unloadable.py and
tests/ui/test_unloadable_window.py check the messages)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from tests.support.gguf_rewrite import rewrite

import offload_planner
from offload_planner.core.errors import GGUFError
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.loadable import open_loadable, require_loadable

PACKAGE = Path(offload_planner.__file__).resolve().parent

#: modules that may call ``open_model`` itself: the reader, the loadable entry, ``inspect`` (it shows
#: a model llama.cpp refuses, with the reason) and the synth (it reads back the file it wrote)
READERS = {"core/gguf_reader.py", "core/loadable.py", "cli.py", "core/synth/random_fill.py"}


def _calls(name: str) -> set[str]:
    out = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                out.add(path.relative_to(PACKAGE).as_posix())
    return out


def test_only_the_loadable_entry_opens_models_to_plan() -> None:
    assert _calls("require_loadable") == {"core/loadable.py"}
    assert _calls("open_loadable") >= {"cli_fit.py", "cli_launch.py", "cli_plan.py", "cli_plan_file.py",
                                       "core/speculative.py", "ui/loader.py"}
    assert _calls("open_model") <= READERS


@pytest.mark.parametrize("change", [dict(drop="qwen3moe.context_length"),
                                    dict(u32=("qwen3moe.expert_used_count", 9)),
                                    dict(rename=("blk.3.ffn_up_exps.weight", "blk.400.ffn_up_exps.weight"))])
def test_refusals_are_require_loadables(small_models: dict[str, Path], tmp_path: Path,
                                        change: dict[str, object]) -> None:
    path = rewrite(small_models["qwen3moe"], tmp_path / "m.gguf", **change)  # type: ignore[arg-type]
    with pytest.raises(GGUFError) as old:
        require_loadable(open_model(path))
    with pytest.raises(GGUFError) as new:
        open_loadable(path)
    assert str(new.value) == str(old.value)
    assert str(path) in str(new.value)


def test_a_loadable_model_opens_with_progress(small_models: dict[str, Path]) -> None:
    seen: list[tuple[int, int]] = []
    model = open_loadable(small_models["qwen3moe"], progress=lambda d, t: seen.append((d, t)))
    assert model.summary == open_model(small_models["qwen3moe"]).summary
    assert seen and seen[-1][0] == seen[-1][1] == len(model.shards)
