"""Shared state of one parse: what handlers read and write."""

from __future__ import annotations

from dataclasses import dataclass

from offload_planner.core.cmdline.ecma_regex import check_pattern
from offload_planner.core.cmdline.model import ArgError, ArgWarning, FlagUse, ParsedArgs, ServerArgs, Stage
from offload_planner.core.dialects.base import Dialect


class HandlerError(Exception):
    """A value a flag's handler refuses.

    ``what`` is the C++ exception text (mainline prints it after ``error while handling argument``);
    ``invalid_param`` marks ik_llama.cpp's ``invalid_param = true`` path; ``stderr`` is a line
    ik prints before its generic message.
    """

    def __init__(
        self, what: str, *, invalid_param: bool = False, stderr: str = "", explanation: str = ""
    ) -> None:
        super().__init__(what)
        self.what = what
        self.invalid_param = invalid_param
        self.stderr = stderr
        self.explanation = explanation


@dataclass
class MmapFlags:
    """The pre-``--load-mode`` flags, folded into a load mode at the end."""

    mmap: bool | None = None
    mlock: bool | None = None
    direct_io: bool | None = None

    def load_mode(self) -> str | None:
        if self.mmap is None and self.mlock is None and self.direct_io is None:
            return None
        mmap = self.mmap is not False
        if self.direct_io:
            return "dio"
        if self.mlock:
            return "mmap+mlock" if mmap else "mlock"
        return "mmap" if mmap else "none"


@dataclass
class Ctx:
    parsed: ParsedArgs
    use: FlagUse
    mmap_flags: MmapFlags

    @property
    def args(self) -> ServerArgs:
        return self.parsed.args

    @property
    def dialect(self) -> Dialect:
        return self.parsed.dialect

    @property
    def value(self) -> str:
        return self.use.values[0]

    def warn(self, message: str, value: str | None = None) -> None:
        self.parsed.warnings.append(ArgWarning(self.use.spelling, value, message))

    def check_override_pattern(self, pattern: str) -> None:
        """Errors and warnings for an ``-ot`` regex (llama.cpp compiles it with std::regex at load)."""
        check = check_pattern(pattern)
        flag = self.use.env or self.use.spelling
        for warning in check.warnings:
            self.parsed.warnings.append(ArgWarning(flag, pattern, warning))
        if check.error is not None:
            self.parsed.errors.append(
                ArgError(
                    flag,
                    pattern,
                    f"llama_model_load: error loading model: {check.error}",
                    Stage.LOAD,
                    "the arguments are accepted, but std::regex rejects the pattern when the model "
                    "loads, and the server exits",
                )
            )
