"""Why a launch failed, from the server's log: out of memory on a device (CUDA, RPC, host) with
the smallest plan change that fits (:mod:`offload_planner.backend.launch.plan_fix`), an unknown
``-ot`` buffer type, a missing model file, a bad flag, a crash."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from offload_planner.backend.launch.plan_fix import PlanContext, Suggestion, suggest_fix
from offload_planner.backend.log_parser import LoadReport, OomEvent, device_of_buffer
from offload_planner.core.cmdline import Dialect, parse_server_args
from offload_planner.core.errors import PlannerError


@dataclass(frozen=True)
class Explanation:
    kind: str  # oom | bad-flag | unknown-buft | missing-model | load-error | crash | exit | start
    title: str
    detail: str = ""
    device: str | None = None  # the device to highlight
    lines: tuple[str, ...] = ()
    suggestion: Suggestion | None = None

    def text(self) -> str:
        out = [self.title]
        if self.detail:
            out.append("  " + self.detail)
        if self.suggestion:
            s = self.suggestion
            out.append("  suggestion: " + s.summary + ("" if s.verified else " (estimate)"))
            if s.detail:
                out.append("  " + s.detail)
        return "\n".join(out)


_BAD_FLAG = re.compile(r"error: (?:invalid|unknown) argument: (?P<flag>\S+)")
_BAD_VALUE = re.compile(r"error while handling argument \"(?P<flag>[^\"]+)\": (?P<msg>.*)")
_NO_FILE = re.compile(r"failed to open GGUF file '(?P<path>[^']*)'(?: \((?P<why>[^)]*)\))?")
_LOAD_FROM = re.compile(r"failed to load model from (?P<path>\S+)")
_LOAD_ERROR = re.compile(r"error loading model: (?P<msg>.*)$")


def explain_failure(
    report: LoadReport,
    *,
    exit_code: int | None,
    crashed: bool = False,
    tail: Sequence[str] = (),
    context: PlanContext | None = None,
    start_error: str | None = None,
    resolve: Mapping[str, str] | None = None,
) -> list[Explanation]:
    """Why the server stopped (or never started), most specific first."""
    if start_error:
        return [Explanation("start", f"llama-server did not start: {start_error}")]
    out: list[Explanation] = []
    lines = list(dict.fromkeys([*report.errors, *tail]))
    for ln in lines:
        m = _BAD_FLAG.search(ln)
        if m:
            out.append(_bad_flag(m["flag"], ln, context))
            break
    for ln in lines:
        m = _BAD_VALUE.search(ln)
        if not m:
            continue
        if "unknown buffer type" in m["msg"]:
            avail = _available_buffer_types(tail)
            detail = ("this llama-server knows the buffer types " + ", ".join(avail) if avail
                      else "the target after = must be a buffer type this server offers")
            if any(a.startswith("RPC") for a in avail):
                detail += " (RPC devices are named RPC0[host:port] in -ot)"
            out.append(Explanation("unknown-buft", f"{m['flag']}: unknown buffer type", detail, lines=(ln,)))
        else:
            out.append(Explanation("bad-flag", f"{m['flag']}: {m['msg']}", lines=(ln,)))
        break
    for ln in lines:
        m = _NO_FILE.search(ln) or _LOAD_FROM.search(ln)
        if m and (m.groupdict().get("why") or not Path(m["path"]).exists()):
            why = m.groupdict().get("why") or "no such file"
            out.append(Explanation("missing-model", f"model file not found: {m['path']}",
                                   f"llama-server could not open it ({why})", lines=(ln,)))
            break
    resolve = dict(resolve) if resolve is not None else report.rpc_endpoints()
    seen: set[tuple[str | None, str | None]] = set()
    for ev in report.oom:
        dev = device_of_buffer(ev.device, resolve) if ev.device else None
        if (dev, ev.kind) in seen:
            continue
        seen.add((dev, ev.kind))
        out.append(explain_oom(ev, dev, report, context))
    if not out:
        for ln in lines:
            m = _LOAD_ERROR.search(ln)
            if m:
                out.append(Explanation("load-error", f"llama-server could not load the model: {m['msg']}",
                                       lines=(ln,)))
                break
    if crashed:
        sig = f" (signal {exit_code})" if exit_code else ""
        out.append(Explanation("crash", f"llama-server crashed{sig}",
                               "last lines: " + " | ".join(tail[-3:]) if tail else ""))
    elif exit_code not in (None, 0) and not out:
        errs = [ln for ln in lines if ln in report.errors][-3:]
        out.append(Explanation("exit", f"llama-server exited with code {exit_code}",
                               " | ".join(errs or tail[-3:]), lines=tuple(errs)))
    return out


def _available_buffer_types(tail: Sequence[str]) -> list[str]:
    out: list[str] = []
    grab = False
    for ln in tail:
        if ln.strip() == "Available buffer types:":
            grab, out = True, []
            continue
        if grab:
            if ln.startswith("  ") and ln.strip():
                out.append(ln.strip())
            else:
                grab = False
    return out


def _bad_flag(flag: str, line: str, context: PlanContext | None) -> Explanation:
    detail = ""
    if context is not None:
        parsed = parse_server_args([flag], dialect=Dialect(context.dialect))
        hint = next((e.explanation for e in parsed.errors if e.explanation), "")
        if hint:
            detail = hint
    renamed = {"--no-mmap": "-lm none", "--mlock": "-lm mlock",
               "-fmoe": "(fused MoE is on by default; drop it)"}
    if flag in renamed:
        detail = (detail + "; " if detail else "") + f"this build spells it {renamed[flag]}"
    return Explanation("bad-flag", f"llama-server does not accept {flag}", detail, lines=(line,))


# --- out of memory ---------------------------------------------------------------------------------

_KIND_LABEL = {"model": "weights", "kv": "KV cache", "rs": "recurrent state", "compute": "compute buffer",
               "output": "output buffer", None: "a buffer"}


def explain_oom(ev: OomEvent, device: str | None, report: LoadReport,
                context: PlanContext | None) -> Explanation:
    what = _KIND_LABEL.get(ev.kind, "a buffer")
    size = f" of {ev.mib:.2f} MiB" if ev.mib else ""
    name = device or "a device"
    if ev.runtime:
        title = f"{name} ran out of memory while serving"
        detail = "an allocation outside the reserved buffers failed (cuBLAS workspace, a larger batch)"
    else:
        title = f"{name} is out of memory: could not allocate {what}{size}"
        detail = ""
    logged = next((d for d in report.devices if d.name == device), None)
    if logged is not None and not ev.runtime:
        detail = f"it reported {logged.free_mib} MiB free when the load started"
    sug = None
    if context is not None and context.projection is not None and device is not None:
        try:
            sug = suggest_fix(context, device, ev.kind, ev.mib)
        except (PlannerError, KeyError, ValueError, StopIteration):
            sug = None
    return Explanation("oom", title, detail, device=device, lines=(ev.line,), suggestion=sug)
