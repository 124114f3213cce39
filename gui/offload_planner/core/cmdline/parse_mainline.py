"""Mainline llama.cpp's argument parser (``common/arg.cpp: common_params_parse_ex``), replayed.

Order of events, as in llama.cpp: every option's environment variable (in the order the options
are defined; ``LLAMA_ARG_NO_X`` counts as ``LLAMA_ARG_X=0``), then the command line left to right.
``--foo_bar`` is read as ``--foo-bar``.  The first refusal ends llama-server; we record them all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from offload_planner.core.cmdline.cnum import CNumberError, ignored_tail, stof, stoi, stoul
from offload_planner.core.cmdline.context import Ctx, HandlerError, MmapFlags
from offload_planner.core.cmdline.flagspec import FlagSpec, ValueKind, normalize_spelling
from offload_planner.core.cmdline.handlers_mainline import (
    MAINLINE_CHECKS,
    MAINLINE_HANDLERS,
    falsey,
    split_list,
    truthy,
)
from offload_planner.core.cmdline.handlers_spec import SPEC_HANDLERS
from offload_planner.core.cmdline.model import ArgError, ArgWarning, FlagUse, ParsedArgs
from offload_planner.core.cmdline.secrets import masked
from offload_planner.core.cmdline.tables import flag_table, unknown_flag_hint
from offload_planner.core.dialects.base import Dialect

# Flags whose handler appends, so repeating them is fine despite llama.cpp's warning.
ACCUMULATING = frozenset(
    {"--override-tensor", "--n-cpu-moe", "--n-cpu-ffn", "--rpc", "--lora", "--spec-type"}
)
REPEAT_WARNING = (
    "DEPRECATED: argument '{}' specified multiple times, use comma-separated values instead "
    "(only last value will be used)"
)


def _env_value(spec: FlagSpec, env: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, value) llama.cpp reads for ``spec``; ``LLAMA_ARG_NO_X`` wins and means "0"."""
    if spec.neg_env is not None and spec.neg_env in env:
        return spec.neg_env, "0"
    if spec.env is not None and spec.env in env:
        return spec.env, env[spec.env]
    return None


class MainlineParser:
    def __init__(self, dialect: Dialect, parsed: ParsedArgs) -> None:
        self.dialect = dialect
        self.parsed = parsed
        self.table = flag_table(dialect)
        self.mmap = MmapFlags()

    # ------------------------------------------------------------------ environment
    def apply_env(self, env: Mapping[str, str]) -> None:
        for spec in self.table.set_by(env):
            found = _env_value(spec, env)
            if found is None:
                continue
            var, value = found
            try:
                self._apply_env_value(spec, var, value)
            except (HandlerError, CNumberError) as exc:
                what = exc.what if isinstance(exc, HandlerError) else str(exc)
                explanation = exc.about(var, value) if isinstance(exc, CNumberError) else exc.explanation
                message = f'error while handling environment variable "{spec.env}": {what}'
                self.parsed.errors.append(ArgError(var, value, message, explanation=explanation))

    def _apply_env_value(self, spec: FlagSpec, var: str, value: str) -> None:
        positive = True
        values: tuple[str, ...] = ()
        if spec.kind is ValueKind.NONE:
            if not truthy(value):
                return
        elif spec.kind is ValueKind.BOOL:
            if not (truthy(value) or falsey(value)):
                raise HandlerError("invalid boolean value")
            positive = truthy(value)
        elif spec.kind is ValueKind.INT:
            stoi(value)
            values = (value,)
        elif spec.kind is ValueKind.STRING:
            values = (value,)
        else:
            return  # two-value options have no env form
        use = FlagUse(
            spec.names[0] if positive else (spec.neg or spec.names)[0], spec.key, values, -1, positive, var
        )
        self._dispatch(spec, use)

    # ------------------------------------------------------------------ command line
    def apply_argv(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        seen: set[str] = set()
        i = 0
        while i < len(argv):
            i = self._one(argv, i, seen, env)

    def _one(self, argv: Sequence[str], i: int, seen: set[str], env: Mapping[str, str]) -> int:
        raw = argv[i]
        arg = normalize_spelling(raw)
        found = self.table.lookup(arg)
        if found is None:
            return self._unknown(argv, i, arg)
        spec = found.spec
        if arg in seen and arg != "--spec-type":
            note = "the handler appends: every value is used" if spec.key in ACCUMULATING else ""
            self.parsed.warnings.append(ArgWarning(raw, None, REPEAT_WARNING.format(arg), note))
        seen.add(arg)
        if _env_value(spec, env) is not None:
            msg = (
                f"warn: {spec.env} environment variable is set, but will be overwritten by "
                f"command line argument {arg}"
            )
            self.parsed.warnings.append(ArgWarning(raw, None, msg))
        arity = spec.arity
        if self.dialect.bare_flash_attn and spec.key == "--flash-attn":
            arity = self._bare_fa_arity(argv, i)
        values = tuple(argv[i + 1 : i + 1 + arity])
        use = FlagUse(
            raw,
            spec.key,
            values if arity else ("on",) if spec.key == "--flash-attn" else (),
            i,
            found.positive,
        )
        if len(values) < arity:
            self._error(use, arg, "expected value for argument", "the flag is the last argument")
            self.parsed.passthrough.extend(argv[i:])
            return len(argv)
        self._dispatch(spec, use, arg)
        return i + 1 + arity

    def _bare_fa_arity(self, argv: Sequence[str], i: int) -> int:
        """2025 builds before the ``-fa on|off|auto`` change took a bare ``-fa``."""
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if nxt is not None and (
            truthy(nxt) or falsey(nxt) or nxt in ("auto", "-1") or not nxt.startswith("-")
        ):
            return 1
        msg = "bare -fa: builds before September 2025 read it as 'on'; later 2025 builds need -fa on|off|auto"
        self.parsed.warnings.append(ArgWarning(argv[i], None, msg))
        return 0

    def _unknown(self, argv: Sequence[str], i: int, arg: str) -> int:
        explanation = unknown_flag_hint(self.dialect, arg)
        shown, raw = masked([arg, argv[i]])  # --api-key=VALUE: refused, and not quoted with its value
        self.parsed.errors.append(
            ArgError(raw, None, f"error: invalid argument: {shown}", explanation=explanation)
        )
        take = 2 if i + 1 < len(argv) and not looks_like_flag(argv[i + 1]) else 1
        self.parsed.passthrough.extend(argv[i : i + take])
        return i + take

    def _dispatch(self, spec: FlagSpec, use: FlagUse, arg: str | None = None) -> None:
        self.parsed.flags.append(use)
        handler = MAINLINE_HANDLERS.get(spec.key) or SPEC_HANDLERS.get(spec.key)
        ctx = Ctx(self.parsed, use, self.mmap)
        try:
            if handler is not None:
                handler(ctx)
            elif spec.key in MAINLINE_CHECKS:
                MAINLINE_CHECKS[spec.key](ctx)
            elif spec.kind is ValueKind.INT:
                stoi(use.values[0])
            elif spec.key in STOF_FLAGS:
                stof(use.values[0])
            elif spec.key in STOUL_FLAGS:
                stoul(use.values[0])
        except (HandlerError, CNumberError) as exc:
            if use.env is not None:
                raise
            what = exc.what if isinstance(exc, HandlerError) else str(exc)
            if isinstance(exc, CNumberError):
                explanation = exc.about(use.spelling, use.values[0] if use.values else "")
            else:
                explanation = exc.explanation
            self._error(use, arg or use.spelling, what, explanation)
        else:
            number_tail_notes(self.parsed, spec, use)
        if handler is None and use.env is None:
            self.parsed.passthrough.extend((use.spelling, *use.values))

    def _error(self, use: FlagUse, arg: str, what: str, explanation: str = "") -> None:
        message = f'error while handling argument "{arg}": {what.rstrip()}'
        value = use.values[0] if use.values else None
        self.parsed.errors.append(ArgError(use.spelling, value, message, explanation=explanation))

    def finish(self) -> None:
        mode = self.mmap.load_mode()
        if mode is not None:
            self.parsed.args.load_mode = mode


#: Flags the planner keeps verbatim whose value llama-server reads with ``std::stof`` / ``std::stoul``
#: (common/arg.cpp of the pinned build): a value that is no number is refused there ('error while
#: handling argument "--temp": stof'), so here too; a number with a tail (``1.5x``) loads.
STOF_FLAGS = frozenset({
    "--temp", "--top-p", "--min-p", "--top-nsigma", "--xtc-probability", "--xtc-threshold", "--typical",
    "--repeat-penalty", "--presence-penalty", "--frequency-penalty", "--dry-multiplier", "--dry-base",
    "--adaptive-target", "--adaptive-decay", "--dynatemp-range", "--dynatemp-exp", "--mirostat-lr",
    "--mirostat-ent", "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-ext-factor",
    "--yarn-attn-factor", "--yarn-beta-slow", "--yarn-beta-fast", "--video-fps",
    "--slot-prompt-similarity", "--spec-draft-p-split",
})
STOUL_FLAGS = frozenset({"--cpu-strict", "--poll", "--seed"})

#: Flags read with std::stof / std::stoull item by item (split on ``,`` and ``/``), and flags whose
#: value is a word or a number (``-ngl auto``).
_FLOAT_LISTS = frozenset({"--tensor-split"})
_INT_LISTS = frozenset({"--fit-target"})
_WORD_OR_INT = {"--gpu-layers": ("auto", "all")}


def number_tail_notes(
    parsed: ParsedArgs, spec: FlagSpec, use: FlagUse, int_keys: frozenset[str] = frozenset()
) -> None:
    """``-c 32k``: std::stoi reads 32 and ignores ``k``; llama-server says nothing, we do.
    ``int_keys``: flags read with std::stoi beyond the table's INT kind (ik's table has none)."""
    if not use.values:
        return
    value = use.values[0]
    if spec.key in _FLOAT_LISTS or spec.key in _INT_LISTS:
        items = split_list(value)
        floating = spec.key in _FLOAT_LISTS
    elif spec.kind is ValueKind.INT or spec.key in int_keys or (
        spec.key in _WORD_OR_INT and value not in _WORD_OR_INT[spec.key]
    ):
        items, floating = [value], False
    else:
        return
    flag = f"{use.env}=" if use.env else f"{use.spelling} "
    for item in items:
        tail = ignored_tail(item, floating=floating)
        if tail:
            read = item[: len(item) - len(tail)].strip()
            message = (
                f"{flag}{value}: llama-server reads {read} and ignores {tail!r} (std::"
                f"{'stof' if floating else 'stoi'} stops at the first character that is not part of a "
                "number; it takes no units or suffixes)"
            )
            parsed.warnings.append(ArgWarning(use.env or use.spelling, value, message))


def looks_like_flag(token: str) -> bool:
    if not token.startswith("-") or token == "-":
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False


def parse_mainline(
    argv: Sequence[str], dialect: Dialect, env: Mapping[str, str], parsed: ParsedArgs
) -> ParsedArgs:
    parser = MainlineParser(dialect, parsed)
    env = dict(env)  # os.environ decodes at every look-up; the flag table looks up ~300 variables
    parser.apply_env(env)
    parser.apply_argv(argv, env)
    parser.finish()
    return parsed
