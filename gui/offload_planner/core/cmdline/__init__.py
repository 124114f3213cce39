"""llama-server command lines: flag tables per dialect, parsing, checks, and display formats.

Public API::

    Dialect, detect_dialect(version_text, help_text)
    parse_server_args(argv, *, dialect, env=None) -> ParsedArgs
    ParsedArgs(.args: ServerArgs, .passthrough, .errors, .warnings, .flags)
    check_semantics(parsed, device_names, *, is_mla=False) -> list[ArgError]
    semantic_notes(parsed) -> list[ArgWarning]
    ignored_draft_devices(parsed) -> list[ArgWarning]
    skipped_devices(parsed, device_names) -> list[ArgWarning]
    effective_overrides(parsed, moe_layers=None) -> list[TensorOverride]
    format_command(argv, style, *, dialect, multiline, name) -> str
    args_to_env(args, dialect) -> EnvSplit
    flag_table(dialect) -> FlagTable
    check_pattern(pattern) -> PatternCheck; compile_pattern(pattern) -> re.Pattern
"""

from __future__ import annotations

from offload_planner.core.cmdline.dialect import Dialect, detect_dialect
from offload_planner.core.cmdline.ecma_regex import (
    EcmaRegexError,
    PatternCheck,
    check_pattern,
    compile_pattern,
)
from offload_planner.core.cmdline.emit import Style, format_command
from offload_planner.core.cmdline.envform import EnvSplit, args_to_env
from offload_planner.core.cmdline.flagspec import FlagSpec, FlagTable, ValueKind
from offload_planner.core.cmdline.model import (
    GPU_LAYERS_ALL,
    GPU_LAYERS_AUTO,
    ArgError,
    ArgWarning,
    FlagUse,
    ParsedArgs,
    ServerArgs,
    Stage,
    TensorOverride,
)
from offload_planner.core.cmdline.parse import effective_overrides, parse_server_args
from offload_planner.core.cmdline.semantics import (
    check_semantics,
    ignored_draft_devices,
    rpc_buffer_type_names,
    rpc_device_names,
    semantic_notes,
    skipped_devices,
)
from offload_planner.core.cmdline.tables import flag_table

__all__ = [
    "GPU_LAYERS_ALL",
    "GPU_LAYERS_AUTO",
    "ArgError",
    "ArgWarning",
    "Dialect",
    "EcmaRegexError",
    "EnvSplit",
    "FlagSpec",
    "FlagTable",
    "FlagUse",
    "ParsedArgs",
    "PatternCheck",
    "ServerArgs",
    "Stage",
    "Style",
    "TensorOverride",
    "ValueKind",
    "args_to_env",
    "check_pattern",
    "check_semantics",
    "compile_pattern",
    "detect_dialect",
    "effective_overrides",
    "flag_table",
    "format_command",
    "ignored_draft_devices",
    "parse_server_args",
    "rpc_buffer_type_names",
    "rpc_device_names",
    "semantic_notes",
    "skipped_devices",
]
