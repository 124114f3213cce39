"""``-tb/--threads-batch``: llama.cpp computes a batch of more than one token with ``n_threads_batch``
and a single token with ``n_threads`` (pinned build src/llama-context.cpp:2612 ``int n_threads =
batched ? cparams.n_threads_batch : cparams.n_threads``, ``batched = ubatch.n_tokens > 1`` at :1463;
ik_llama.cpp src/llama.cpp:6344 ``n_tokens == 1 ? cparams.n_threads : cparams.n_threads_batch``).
Without ``-tb`` the batch takes ``-t``'s threads (common/common.cpp:1699; ik common/common.cpp:4341);
``-tb`` 0 or below is ``hardware_concurrency()`` (common/arg.cpp:1534; ik common/common.cpp:1150),
and no environment variable sets it (no ``set_env`` on ``-tb``; ik reads ``LLAMA_ARG_THREADS`` only).

So a prompt's micro-batches (and the speculative verify batch) run as with ``-t`` of ``-tb``'s count,
a generated token as with ``-t``: every expected figure here is the estimate of the same command with
``-t N`` instead, never a number worked out by the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from offload_planner.cli import main
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.efficiency import DEFAULT
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import hardware_for

GiB = 1024**3
#: another machine's CPU (its RAM declared: no probe of this one), 16 physical cores
CPU16 = "CPU=64GiB,ram=2xDDR5-4800,cores=16"
BACKENDS = ["llama.cpp", "ik_llama.cpp"]


def _speed(capsys: pytest.CaptureFixture[str], model: Path, backend: str, *server: str,
           ours: tuple[str, ...] = ()) -> dict[str, Any]:
    argv = ["plan", str(model), "--no-detect", "--device", CPU16, "--backend", backend, *ours, "--json",
            "--", "-c", "1024", *server]
    assert main(argv) == 0
    speed: dict[str, Any] = json.loads(capsys.readouterr().out)["speed"]
    return speed


@pytest.mark.parametrize("backend", BACKENDS)
def test_pp_takes_tb_and_tg_takes_t(small_models: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                    backend: str) -> None:
    model = small_models["llama"]
    both = _speed(capsys, model, backend, "-t", "4", "-tb", "16")
    four = _speed(capsys, model, backend, "-t", "4")
    sixteen = _speed(capsys, model, backend, "-t", "16")
    assert four["pp_tps"] != sixteen["pp_tps"] and four["tg_tps"] != sixteen["tg_tps"]  # threads matter here
    assert both["pp_tps"] == sixteen["pp_tps"]  # a prompt's micro-batches: -tb's 16 threads
    assert [d["pp_ms"] for d in both["devices"]] == [d["pp_ms"] for d in sixteen["devices"]]
    assert (both["tg_tps"], both["tg_tps_at_ctx"]) == (four["tg_tps"], four["tg_tps_at_ctx"])  # a token: -t 4
    assert both["pp_bottleneck"] == sixteen["pp_bottleneck"] and both["bottleneck"] == four["bottleneck"]
    # the assumptions (text and JSON) say which threads pp used
    said = {a["what"]: a for a in both["assumptions"]}
    assert said["CPU threads in a batch (pp: -tb 16)"]["value"] == 16
    assert said["CPU compute in a batch (-tb 16)"]["value"] == next(
        a["value"] for a in sixteen["assumptions"] if a["what"] == "CPU compute")
    assert not any("-tb" in a["what"] for a in four["assumptions"])


def test_the_text_names_the_batch_threads(small_models: dict[str, Path],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", str(small_models["llama"]), "--no-detect", "--device", CPU16, "--", "-c", "1024"]
    assert main([*base, "-t", "4", "-tb", "16"]) == 0
    out = capsys.readouterr().out
    assert "CPU threads in a batch (pp: -tb 16): 16 threads" in out
    assert "a single token with -t 4" in out
    assert "CPU limited by -t 4:" in out  # a token's reads: 4 threads' share of the bandwidth


def test_tb_equal_to_t_or_absent_changes_nothing(small_models: dict[str, Path],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``-tb`` as many as ``-t`` is the default (common.cpp:1699): the same estimate, the same text
    but for the command line that ends it."""
    base = ["plan", str(small_models["llama"]), "--no-detect", "--device", CPU16,
            "--", "-c", "1024", "-t", "8"]
    assert main(base) == 0
    plain = capsys.readouterr().out
    assert main([*base, "-tb", "8"]) == 0
    same = capsys.readouterr().out
    assert plain.rstrip("\n").rsplit("\n", 1)[0] == same.rstrip("\n").rsplit("\n", 1)[0]
    assert same.rstrip("\n").endswith("-t 8 -tb 8") and "-tb" not in plain


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_environment_variable_sets_tb(small_models: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    """Neither build reads ``LLAMA_ARG_THREADS_BATCH`` (mainline's ``-tb`` has no ``set_env``,
    common/arg.cpp:1529-1538; ik's ``gpt_params_parse_from_env`` has no such line): it leaves the
    batch at ``-t``'s threads.  ``LLAMA_ARG_THREADS`` is read, and the command line's ``-t`` wins over
    it (llama-server applies the variables first): the estimate follows the command line's."""
    model = small_models["llama"]
    four = _speed(capsys, model, backend, "-t", "4")
    monkeypatch.setenv("LLAMA_ARG_THREADS_BATCH", "16")
    assert _speed(capsys, model, backend, "-t", "4")["pp_tps"] == four["pp_tps"]
    monkeypatch.delenv("LLAMA_ARG_THREADS_BATCH")
    monkeypatch.setenv("LLAMA_ARG_THREADS", "16")
    overridden = _speed(capsys, model, backend, "-t", "4")
    assert (overridden["tg_tps"], overridden["pp_tps"]) == (four["tg_tps"], four["pp_tps"])


def test_tb_beyond_the_declared_cores_is_counted_as_t_is(small_models: dict[str, Path],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``-tb 32`` on 16 declared cores: the batch's figures are those of ``-t 32`` (its threads share
    the cores, warned), a token's those of ``-t 4``; the warning names ``-tb``."""
    model = small_models["llama"]
    both = _speed(capsys, model, "llama.cpp", "-t", "4", "-tb", "32")
    t32 = _speed(capsys, model, "llama.cpp", "-t", "32")
    four = _speed(capsys, model, "llama.cpp", "-t", "4")
    assert both["pp_tps"] == t32["pp_tps"] != four["pp_tps"]
    assert both["tg_tps"] == four["tg_tps"]
    assert "warnings" not in four and len(both["warnings"]) == 1
    w = both["warnings"][0]
    assert "32 compute threads (32 llama-server (-tb)) on 16 physical cores" in w
    assert "in a batch of more than one token (pp)" in w and "consider -tb 16" in w
    assert t32["warnings"][0].endswith("consider -t 16")


def test_tb_zero_is_all_the_cores_as_t_zero_is(small_models: dict[str, Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """``-tb 0`` (or below) is ``hardware_concurrency()`` (common/arg.cpp:1534), which the estimate
    counts as it counts ``-t 0``: the cores."""
    model = small_models["llama"]
    zero = _speed(capsys, model, "llama.cpp", "-t", "4", "-tb", "0")
    assert zero["pp_tps"] == _speed(capsys, model, "llama.cpp", "-t", "0")["pp_tps"]
    assert zero["pp_tps"] == _speed(capsys, model, "llama.cpp", "-t", "4", "-tb", "-1")["pp_tps"]
    assert zero["pp_tps"] != _speed(capsys, model, "llama.cpp", "-t", "4")["pp_tps"]


def test_a_micro_batch_of_one_token_runs_with_t(small_models: dict[str, Path]) -> None:
    """A 513-token prompt at ``-ub 512`` is a 512-token micro-batch (``-tb``) and a one-token one
    (``-t``: ``ubatch.n_tokens > 1`` is false)."""
    model = open_model(small_models["llama"])
    declared = (("ram", "2xDDR5-4800"), ("cores", "16"))
    cpu = Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB, hardware=declared)
    devices = DeviceSet(cpu, ())
    plan = plan_from_args(model, devices, parse_server_args(["-c", "1024", "-ub", "512"]))

    def seconds(prompt: int, threads: int, batch: int | None = None) -> float:
        hw = hardware_for(devices, threads=threads, threads_batch=batch)
        return prompt / estimate(plan, hw, prompt=prompt, eff=DEFAULT).pp_tps

    mixed = seconds(513, 4, 16)
    assert mixed == pytest.approx(seconds(512, 16) + seconds(513, 4) - seconds(512, 4), rel=1e-12)
    assert seconds(1, 4, 16) == pytest.approx(seconds(1, 4), rel=1e-12)
    assert seconds(2, 4, 16) == pytest.approx(seconds(2, 16), rel=1e-12)


def test_the_verify_batch_takes_tb_and_a_draft_pass_t(small_models: dict[str, Path],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """MTP: the target verifies n + 1 tokens in one batch (``-tb``), the head drafts one token a pass
    (``-t``); the draft's context takes the main ``cpuparams_batch`` (common/arg.cpp:890,
    common/speculative.cpp:2553-2555)."""
    model = small_models["glm4moe"]
    mtp = ("--spec-type", "draft-mtp")
    both = _speed(capsys, model, "llama.cpp", *mtp, "-t", "4", "-tb", "16")["speculative"]
    four = _speed(capsys, model, "llama.cpp", *mtp, "-t", "4")["speculative"]
    sixteen = _speed(capsys, model, "llama.cpp", *mtp, "-t", "16")["speculative"]
    assert four["verify_ms"] != sixteen["verify_ms"] and four["draft_ms"] != sixteen["draft_ms"]
    assert both["verify_ms"] == sixteen["verify_ms"] and both["draft_ms"] == four["draft_ms"]


def test_fit_keeps_and_estimates_with_t_and_tb(small_models: dict[str, Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Every candidate keeps the user's ``-t``/``-tb`` and is estimated with them: each candidate's pp
    is ``-t 16``'s, its tg ``-t 4``'s (the candidates computing on the CPU differ between the two).
    ``--no-op-offload`` keeps the prompt's work of the CPU's layers on the CPU: with op offload a
    micro-batch takes their matrices and their attention to the GPU (core.speed.pp.HostAttention)."""
    def fit(*threads: str) -> dict[str, Any]:
        argv = ["fit", str(small_models["glm4moe"]), "--no-detect",
                "--device", "CUDA0=40MiB,bw=500GB/s,margin=0B", "--device", CPU16, "--goal", "pp", "--json",
                "--", "-c", "1024", "--no-op-offload", *threads]
        assert main(argv) == 0
        out: dict[str, Any] = json.loads(capsys.readouterr().out)
        return out

    both, sixteen, four = fit("-t", "4", "-tb", "16"), fit("-t", "16"), fit("-t", "4")
    rows = {k: [(c["label"], c["tg_tps"], c["pp_tps"]) for c in v["candidates"]]
            for k, v in {"both": both, "sixteen": sixteen, "four": four}.items()}
    assert [r[2] for r in rows["four"]] != [r[2] for r in rows["sixteen"]]
    assert [r[1] for r in rows["four"]] != [r[1] for r in rows["sixteen"]]
    assert [r[2] for r in rows["both"]] == [r[2] for r in rows["sixteen"]]
    assert [r[1] for r in rows["both"]] == [r[1] for r in rows["four"]]
    assert both["speed"]["pp_tps"] == sixteen["speed"]["pp_tps"]
    assert both["speed"]["tg_tps"] == four["speed"]["tg_tps"]
    command = both["plan"]["command"]
    assert command[command.index("-t") + 1] == "4" and command[command.index("-tb") + 1] == "16"


def test_the_window_reads_t_and_tb_from_the_plans_flags(small_models: dict[str, Path]) -> None:
    """The window estimates from the plan's kept flags (``speed_store.machine_hardware`` without a
    parsed command): ``-tb``/``--threads-batch`` there too, and the last of a repeated flag, as
    llama-server keeps it."""
    from offload_planner.backend.speed_store import machine_hardware, threads_batch_in, threads_in

    declared = (("ram", "2xDDR5-4800"), ("cores", "16"))
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB, hardware=declared), ())
    args = ["-c", "1024", "-t", "2", "-t", "4", "--threads-batch", "16"]
    plan = plan_from_args(open_model(small_models["llama"]), devices, parse_server_args(args))
    hw = machine_hardware(plan, probe=False)
    assert hw["CPU"].threads == 4 and hw.batch is not None and hw.batch["CPU"].threads == 16
    assert hw.for_tokens(1) is hw and hw.for_tokens(2) is hw.batch
    assert (threads_in(args), threads_batch_in(args)) == (4, 16)
    assert threads_batch_in(["-tb", "0"]) == 0 and threads_batch_in(["-tb", "8x"]) == 8
    assert threads_batch_in(["-t", "8"]) is None
