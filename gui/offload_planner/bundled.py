"""Files the package ships: the demo model header (Qt-free, so the CLI, the window and the tests
share one way to find it)."""

from __future__ import annotations

from pathlib import Path

DEMO_MODEL = "DeepSeek-V3-Q4_K_M.header.gguf"


def demo_model_path() -> Path:
    """The bundled header-only DeepSeek-V3 Q4_K_M, from an installed wheel or a source checkout."""
    try:
        from offload_planner.resources import resource_path
    except ImportError:  # a checkout on PYTHONPATH without the editable install's resources
        import offload_planner

        return Path(offload_planner.__file__).resolve().parents[2] / "resources" / DEMO_MODEL
    return resource_path(DEMO_MODEL)
