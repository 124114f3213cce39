"""ik_llama.cpp's argument parser (``gpt_params_parse`` / ``gpt_params_find_arg``), replayed.

The environment (only :data:`IK_ENV`) is read first, then the command line.  Unknown flags give
``error: unknown argument: <flag>``; a missing or refused value ``error: invalid parameter for
argument: <flag>``; a ``std::stoi`` failure prints just ``stoi``.  Overrides that ``--cpu-moe`` /
``--n-cpu-moe`` stand for are made at load time from the model (see :func:`effective_overrides`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from offload_planner.core.cmdline.cnum import CNumberError, stof, stoi
from offload_planner.core.cmdline.context import Ctx, HandlerError, MmapFlags
from offload_planner.core.cmdline.flags_ik import IK_ENV, IK_KV_TYPES, IK_UNCHECKED_VALUE
from offload_planner.core.cmdline.flagspec import FlagSpec, normalize_spelling
from offload_planner.core.cmdline.handlers_ik import IK_CHECKS, IK_HANDLERS, IK_INT_FLAGS
from offload_planner.core.cmdline.handlers_ik_spec import IK_SPEC_HANDLERS, chain_errors
from offload_planner.core.cmdline.model import ArgError, ArgWarning, FlagUse, ParsedArgs, Stage
from offload_planner.core.cmdline.parse_mainline import looks_like_flag, number_tail_notes
from offload_planner.core.cmdline.secrets import masked
from offload_planner.core.cmdline.tables import flag_table, unknown_flag_hint

# Handlers that throw for legacy speculative flags (ik rejects them with its own message).
_LEGACY_SPEC = frozenset(
    {
        "--draft",
        "--draft-min",
        "--draft-p-min",
        "--spec-stage",
        "--spec-ngram-size-n",
        "--spec-ngram-size-m",
        "--spec-ngram-min-hits",
        "--suffix-pattern-len",
        "--suffix-max-depth",
        "--suffix-corpus",
        "--multi-token-prediction",
        "--no-multi-token-prediction",
    }
)


_CACHE_TYPE_KEYS = frozenset(
    {"--cache-type-k", "--cache-type-v", "--cache-type-k-draft", "--cache-type-v-draft"})
_BOOL_ENV_FIELDS = {"--k-cache-hadamard": "k_cache_hadamard", "--v-cache-hadamard": "v_cache_hadamard"}


class IkParser:
    def __init__(self, parsed: ParsedArgs) -> None:
        self.parsed = parsed
        self.table = flag_table(parsed.dialect)
        self.mmap = MmapFlags()

    def apply_env(self, env: Mapping[str, str]) -> None:
        for var, (key, kind) in IK_ENV.items():
            if var not in env:
                continue
            spec = self.table.by_key(key)
            if spec is None:
                continue
            self._env_one(spec, var, env[var], kind)

    def _env_one(self, spec: FlagSpec, var: str, value: str, kind: str) -> None:
        try:
            if kind == "int":
                stoi(value)
            elif kind == "float":
                stof(value)
        except CNumberError as exc:
            message = f"terminate called after throwing an instance of 'std::invalid_argument' what(): {exc}"
            explanation = f"{exc.about(var, value)}; ik reads the environment outside its try block"
            self.parsed.errors.append(ArgError(var, value, message, explanation=explanation))
            return
        if kind == "bool":
            on = value in ("1", "true")
            if spec.key == "--flash-attn":
                self.parsed.args.flash_attn = "on" if on else "off"
            elif spec.key == "--mlock":
                self.mmap.mlock = on or None
            elif spec.key in _BOOL_ENV_FIELDS:
                setattr(self.parsed.args, _BOOL_ENV_FIELDS[spec.key], on)
            return
        use = FlagUse(spec.names[0], spec.key, (value,), -1, True, var)
        self._dispatch(spec, use)

    def apply_argv(self, argv: Sequence[str]) -> None:
        i = 0
        while i < len(argv):
            i = self._one(argv, i)

    def _one(self, argv: Sequence[str], i: int) -> int:
        raw = argv[i]
        arg = normalize_spelling(raw)
        found = self.table.lookup(arg)
        if found is None:
            explanation = unknown_flag_hint(self.parsed.dialect, arg)
            shown, flag = masked([arg, raw])  # --api-key=VALUE: refused, and not quoted with its value
            self.parsed.errors.append(
                ArgError(flag, None, f"error: unknown argument: {shown}", explanation=explanation)
            )
            take = 2 if i + 1 < len(argv) and not looks_like_flag(argv[i + 1]) else 1
            self.parsed.passthrough.extend(argv[i : i + take])
            return i + take
        spec = found.spec
        values = tuple(argv[i + 1 : i + 1 + spec.arity])
        use = FlagUse(raw, spec.key, values, i, True)
        if len(values) < spec.arity:
            crash = spec.key in IK_UNCHECKED_VALUE
            explanation = "reads past the end of argv (ik does not check this flag's value)" if crash else ""
            self._invalid(use, arg, explanation=explanation)
            self.parsed.passthrough.extend(argv[i:])
            return len(argv)
        if spec.key in _LEGACY_SPEC and self.parsed.dialect.spec_stages:
            message = f"legacy speculative option '{arg}' is disabled"
            self.parsed.errors.append(ArgError(raw, values[0] if values else None, message))
        self._dispatch(spec, use, arg)
        return i + 1 + spec.arity

    def _dispatch(self, spec: FlagSpec, use: FlagUse, arg: str | None = None) -> None:
        self.parsed.flags.append(use)
        handler = IK_HANDLERS.get(spec.key) or IK_SPEC_HANDLERS.get(spec.key)
        value = use.values[0] if use.values else None
        try:
            if handler is not None:
                handler(Ctx(self.parsed, use, self.mmap))
            elif spec.key in IK_CHECKS:
                IK_CHECKS[spec.key](Ctx(self.parsed, use, self.mmap))
        except CNumberError as exc:  # ik prints the uncaught exception's what(): "stoi"
            flag = use.env or use.spelling
            explanation = exc.about(flag, value or "")
            self.parsed.errors.append(ArgError(flag, value, str(exc), explanation=explanation))
        except HandlerError as exc:
            if exc.invalid_param:
                self._invalid(use, arg or use.spelling, exc.stderr, exc.explanation)
            else:
                self.parsed.errors.append(ArgError(use.env or use.spelling, value, exc.what))
        else:
            number_tail_notes(self.parsed, spec, use, IK_INT_FLAGS)
        if handler is None and use.env is None:
            self.parsed.passthrough.extend((use.spelling, *use.values))
        if (
            spec.key in _CACHE_TYPE_KEYS
            and use.values
            and use.values[0] not in IK_KV_TYPES
        ):
            self.parsed.errors.append(
                ArgError(
                    use.env or use.spelling,
                    use.values[0],
                    f"unsupported KV cache type: {use.values[0]}",
                    Stage.LOAD,
                    "ik_llama.cpp accepts any -ctk/-ctv text and refuses it when it creates the context "
                    f"(allowed: {', '.join(IK_KV_TYPES)}; wording not verified)",
                )
            )

    def _invalid(self, use: FlagUse, arg: str, stderr: str = "", explanation: str = "") -> None:
        value = use.values[0] if use.values else None
        detail = "; ".join(x for x in (f"ik first prints: {stderr}" if stderr else "", explanation) if x)
        message = f"error: invalid parameter for argument: {arg}"
        self.parsed.errors.append(ArgError(use.spelling, value, message, explanation=detail))

    def finish(self) -> None:
        mode = self.mmap.load_mode()
        if mode is not None:
            self.parsed.args.load_mode = mode
        if not self.parsed.errors:  # ik stops at the first refusal: the chain is checked after the line
            for what in chain_errors(self.parsed.args.draft):
                message = f"error: invalid speculative stage configuration: {what}"
                use = next((f for f in reversed(self.parsed.flags) if f.key == "--spec-type"), None)
                self.parsed.errors.append(ArgError(use.spelling if use else "--spec-type",
                                                   use.values[0] if use else None, message))
        self._single_slot()

    def _single_slot(self) -> None:
        """``common_speculative_prepare_startup`` (common/speculative.cpp 2078-2094) drops an ``mtp``
        stage when ``-np`` > 1; any stage left makes ``load_model`` fail (examples/server/
        server-context.cpp 220-225)."""
        args = self.parsed.args
        n_parallel = args.n_parallel or 1
        if n_parallel <= 1 or not args.draft.types:
            return
        if "mtp" in args.draft.types:
            self.parsed.warnings.append(ArgWarning(
                "--spec-type", "mtp", "MTP is not supported with parallel slots yet, removing the MTP stage "
                f"to avoid cross-slot corruption. n_parallel={n_parallel}"))
            args.draft.types = [t for t in args.draft.types if t != "mtp"]
            args.draft.stages = [s for s in args.draft.stages if s[0] != "mtp"]
        if any(t != "mtp" for t in args.draft.types):
            self.parsed.errors.append(ArgError(
                "--parallel", str(n_parallel),
                "Speculative decoding is currently limited to a single server slot (-np 1).", Stage.LOAD,
                "ik_llama.cpp's server refuses a speculative stage with more than one slot"))


def parse_ik(argv: Sequence[str], env: Mapping[str, str], parsed: ParsedArgs) -> ParsedArgs:
    parser = IkParser(parsed)
    parser.apply_env(env)
    parsed.args.draft.env = {var: env[var] for var in IK_ENV if var in env}  # read again for -draft
    parser.apply_argv(argv)
    parser.finish()
    return parsed
