"""ik_llama.cpp's ``-draft "ARGS"`` / ``--draft-params "ARGS"``: a command line of its own, checked as ik
checks it when it loads the draft model (ikawrakow/ik_llama.cpp 8337e4cd).

``common_speculative_load_draft_model`` copies the main parameters (``params_dft = params_base``,
common/speculative.cpp 1946) and parses ``"llama-server " + ARGS`` onto the copy with
``gpt_params_parse`` (1957-1966).  That parser throws ``std::invalid_argument`` for an unknown flag,
a flag missing its value (common/common.cpp 733-737) or a value ``std::stoi``/``std::stof`` refuses;
``gpt_params_parse`` prints the message (838-841), the loader prints the usage and returns false and the
server stops before it serves (2119-2122).  The values it accepts reach the draft's context unchecked:
``-b 0 -ub 0`` is refused by ``llama_init_from_model`` (src/llama.cpp 7966-7968), a negative size is
read as an unsigned one; ``-b 0`` alone is raised to the KQ mask padding (8169-8171) and runs."""

from __future__ import annotations

import copy
import shlex

from offload_planner.core.cmdline.model import ArgError, ArgWarning, FlagUse, ParsedArgs, ServerArgs, Stage
from offload_planner.core.dialects.base import Dialect

#: the draft's sizes that ``llama_context_params`` holds as uint32_t, with the flag that sets each
_SIZES = (("ctx_size", "-c"), ("batch_size", "-b"), ("ubatch_size", "-ub"))


def loads_draft_params(parsed: ParsedArgs) -> bool:
    """ik parses ``-draft`` only while it loads a draft (``has_dft()`` and a stage that
    ``needs_dft_model()``: common/common.cpp 242-246, common/speculative.cpp 2110-2122)."""
    draft = parsed.args.draft
    stages = set(draft.types)
    return bool(draft.params) and bool(stages & parsed.dialect.draft_model_types
                                        or parsed.dialect.mtp_spec_type in stages)


def draft_params_errors(parsed: ParsedArgs) -> list[ArgError]:
    """What ik refuses in the ``-draft`` command line, named by the flag as given: its parse errors, then
    the values the draft's context cannot take (those the main command already has are the main
    command's own refusals)."""
    if not loads_draft_params(parsed):
        return []
    text, flag = parsed.args.draft.params or "", draft_params_flag(parsed)
    where = (f"inside {flag} \"{text}\", which ik_llama.cpp parses onto the draft's parameters when it loads "
             "the draft model: the server stops")
    inner = parse_draft_params(parsed, text)
    own = [e for e in inner.errors if e.flag not in parsed.args.draft.env]  # the main parse's already
    if own:
        e = own[0]  # gpt_params_parse stops at the first
        return [ArgError(flag, text, e.message, Stage.LOAD,
                         f"{e.explanation}; {where}" if e.explanation else where)]
    if not parsed.args.draft.model and _inner_model(inner) is None:
        # params_dft.model = the -md path, "" here (speculative.cpp 1952), and ARGS names none: 1990-1993
        return [ArgError(flag, text, "common_speculative_load_draft_model: failed to load draft model ''",
                         Stage.LOAD, f"no -md, and {flag} \"{text}\" has no -m: ik loads the draft model "
                         "from -md or the -m inside -draft, here an empty path, and the server stops")]
    return _value_errors(parsed.args, inner.args, flag, text, where)


def draft_params_notes(parsed: ParsedArgs) -> list[ArgWarning]:
    """``-draft "-m FILE"``: FILE is the draft model ik loads (it overrides ``-md``: the copy takes
    ``-md`` first, speculative.cpp 1952, then ARGS), and the one the plan projects
    (:func:`loaded_draft_model`)."""
    if not loads_draft_params(parsed):
        return []
    text, flag = parsed.args.draft.params or "", draft_params_flag(parsed)
    inner = parse_draft_params(parsed, text)
    use = _inner_model_use(inner)
    model = use.values[0] if use is not None else None
    if inner.errors or use is None or model == parsed.args.draft.model:
        return []
    md = parsed.args.draft.model
    wins = (f"the -m inside {flag} wins over -md" if use.env is None else
            f"{use.env}, which ik applies again when it parses {flag} (common/common.cpp 829-830), wins "
            "over -md")
    instead = f", not the -md file {md}" if md else ""
    return [ArgWarning(flag, text, f"{flag} \"{text}\": ik loads {model} as the draft model ({wins}); the "
                       f"plan projects it{instead}")]


def loaded_draft_model(parsed: ParsedArgs) -> str | None:
    """The file ik loads as the draft model: the ``-m`` inside ``-draft "ARGS"`` (or ``LLAMA_ARG_MODEL``
    applied again there), else ``-md`` (speculative.cpp 1952-1966, 1988); ``-md`` where ARGS are not
    parsed (:func:`loads_draft_params`) or refused."""
    md = parsed.args.draft.model
    if not loads_draft_params(parsed):
        return md
    inner = parse_draft_params(parsed, parsed.args.draft.params or "")
    return (None if inner.errors else _inner_model(inner)) or md


def draft_params_flag(parsed: ParsedArgs) -> str:
    """``-draft`` or ``--draft-params`` as given."""
    use = next((u for u in reversed(parsed.flags) if u.key == "--draft-params"), None)
    return (use.env or use.spelling) if use else "-draft"


def _inner_model_use(inner: ParsedArgs) -> FlagUse | None:
    """The ``-m`` (or ``LLAMA_ARG_MODEL``) that sets the draft's model in the ``-draft`` parse."""
    use = next((u for u in reversed(inner.flags) if u.key == "--model"), None)
    return use if use is not None and use.values else None


def _inner_model(inner: ParsedArgs) -> str | None:
    use = _inner_model_use(inner)
    return use.values[0] if use is not None else None


def parse_draft_params(parsed: ParsedArgs, text: str) -> ParsedArgs:
    """``gpt_params_parse("llama-server " + ARGS)`` onto a copy of the main parameters."""
    return parse_onto(copy.deepcopy(parsed.args), parsed.dialect, text)


def parse_onto(args: ServerArgs, dialect: Dialect, text: str) -> ParsedArgs:
    """``gpt_params_parse("llama-server " + ARGS)`` onto ``args`` (changed in place): as it parses the
    main command line, the environment's ``LLAMA_ARG_*`` variables first (``gpt_params_parse_from_env``,
    common/common.cpp 829-830; the main command's, kept in ``args.draft.env``), then ARGS: so
    ``LLAMA_ARG_N_GPU_LAYERS`` replaces ``-ngld``, ``LLAMA_ARG_CACHE_TYPE_K`` ``-ctkd`` and
    ``LLAMA_ARG_MODEL`` ``-md`` (speculative.cpp 1950-1954 set those before the parse) unless ARGS sets
    them again."""
    from offload_planner.core.cmdline.parse_ik import parse_ik

    try:
        argv = shlex.split(text)
    except ValueError:
        argv = text.split()
    return parse_ik(argv, dict(args.draft.env), ParsedArgs(dialect, args=args))


def _value_errors(main: ServerArgs, draft: ServerArgs, flag: str, text: str, where: str) -> list[ArgError]:
    for name, short in _SIZES:
        v = getattr(draft, name)
        if v is not None and v < 0 and v != getattr(main, name):
            return [ArgError(flag, text, f"{short} {v}: a negative size, which llama.cpp reads as "
                             f"{v & 0xFFFFFFFF} (unsigned)", Stage.LOAD, where)]
    if draft.batch_size == 0 and draft.ubatch_size == 0 and (main.batch_size, main.ubatch_size) != (0, 0):
        return [ArgError(flag, text, "llama_init_from_model: n_batch and n_ubatch cannot both be zero",
                         Stage.LOAD, f"-b 0 with -ub 0 {where.replace(': the server stops', '')}: "
                         "the draft gets no context and the server stops")]
    return []
