"""`plan` says what would make a plan faster under its bottlenecks (core.speed.advice). A newcomer read
"tg bottleneck: CPU memory bandwidth (66% ...)" and "pp bottleneck: op offload copies over the host link
(84% ...)" on the Guide's first plan and had no word of what to change; the answers were in the same
figures: the GPU's free memory takes routed experts off the RAM, a larger -ub copies the CPU's experts
fewer times a prompt, the always-active weights go to a GPU before any routed expert."""

from __future__ import annotations

from pathlib import Path

from tests.test_cli_plan_input import run

DEMO = str(Path(__file__).resolve().parents[1] / "resources" / "DeepSeek-V3-Q4_K_M.header.gguf")
DEVICES = ("--no-detect", "--device", "CUDA0=24GiB", "--device", "CPU=512GiB,ram=8xDDR5-4800")
FIT = ("    `offload-planner fit` with the same options and arguments searches where the routed experts go "
       "and the -ub for you")


def _plan(*server: str) -> tuple[int, list[str]]:
    r = run("plan", DEMO, *DEVICES, "--", "-c", "32768", *server)
    assert "Traceback" not in r.stderr
    return r.returncode, r.stdout.splitlines()


def _hints(lines: list[str]) -> list[str]:
    """The lines between "to make it faster:" and the assumptions ([] when there is none)."""
    if "  to make it faster:" not in lines:
        return []
    at = lines.index("  to make it faster:")
    return lines[at + 1:lines.index("  assumptions:")]


def test_the_guides_first_plan_says_where_its_speed_is_and_what_searches_it() -> None:
    code, lines = _plan("-ngl", "999", "--cpu-moe")
    assert code == 0
    at = lines.index("  to make it faster:")
    assert lines[at - 1].startswith("  pp bottleneck: op offload copies")  # right under the bottlenecks
    tg, pp, pin, fit = _hints(lines)
    assert tg.startswith("    tg: the CPU's RAM reads take 66% of a token, and CUDA0's 8.46 GiB free beyond "
                         "its margin (1 GiB unless given) can take routed experts")
    assert "-ot 'blk\\.N\\.ffn_.*_exps=CUDA0' for a layer N, ahead of --cpu-moe" in tg
    assert pp.startswith("    pp: op offload takes 84% of a prompt") and "(-ub 512); a larger -ub" in pp
    assert pin == ("    pp: those copies read the mmap'd model file (pageable memory), at half the rate of "
                   "pinned memory (an assumption, below): -lm none loads the CPU's weights into pinned RAM "
                   "instead (the same bytes, read at load)")
    assert fit == FIT
    _, pinned = _plan("-ngl", "999", "--cpu-moe", "-lm", "none")  # what the pin line says, done
    assert not any(h.startswith("    pp: those copies") for h in _hints(pinned))
    assert "pp 24.1 t/s for a 4096-token prompt" in "\n".join(pinned)  # 14.0 with mmap


def test_fits_answer_leaves_nothing_to_say() -> None:
    """The command `fit` prints for these devices (the README's Fastest plan): experts of layer 3 on
    the GPU, -ub 4096 = the prompt: no room for another expert tensor, no fewer copies to gain."""
    code, lines = _plan("-ngl", "999", "-ot", r"blk\.3\.ffn_(up|gate|down|gate_up)_exps=CUDA0", "--cpu-moe",
                        "-b", "4096", "-ub", "4096")
    assert code == 0 and "  pp bottleneck: CUDA0 compute (50% of the prompt time)" in lines
    assert "  to make it faster:" not in lines


def test_always_active_weights_on_the_cpu_are_named_first() -> None:
    """-ngl 30: the attention and shared experts of 32 layers are read from RAM by every token."""
    _, lines = _plan("-ngl", "30", "--cpu-moe")
    first = _hints(lines)[0]
    assert first.startswith("    tg: 4.80 GiB of always-active weights (attention, shared experts, dense "
                            "FFN, output: every token reads all of them) are on the CPU")
    assert "(-ngl 999, with --cpu-moe or -ot exps=CPU keeping the routed experts on the CPU)" in first
    # fit keeps -ngl: its line says what it searches (it said "searches these" under this hint too)
    assert _hints(lines)[-1] == FIT


def test_a_plan_over_capacity_gets_the_over_capacity_advice_instead() -> None:
    code, lines = _plan("-ngl", "999")
    assert code == 3 and "  to make it faster:" not in lines
    assert any("run offload-planner fit for a plan that fits" in line for line in lines)


QWEN = str(Path(__file__).resolve().parents[1] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")


def test_ram_over_beside_a_gpu_with_room_names_the_command_that_moves_the_experts() -> None:
    """Qwen3-30B with --cpu-moe on a 16 GiB CPU and a 24 GiB GPU: the notes said "over capacity: CPU"
    and the warning its 573 MiB, nothing of the 19 GiB the GPU had free for the experts."""
    r = run("plan", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", "CPU=16GiB", "--",
            "--cpu-moe", "-c", "32768")
    assert r.returncode == 3
    assert ("note: CPU is over while CUDA0's 18.99 GiB free beyond its margin (1 GiB unless given) can take "
            "routed experts from it: `offload-planner fit` with the same options and arguments moves them "
            "there (by hand: -ot 'blk\\.N\\.ffn_.*_exps=CUDA0' for a layer N, ahead of --cpu-moe or your "
            "exps=CPU rule)\n") in r.stdout
    fit = run("fit", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", "CPU=16GiB", "--",
              "--cpu-moe", "-c", "32768")
    assert fit.returncode == 0  # what the note sends the reader to finds a plan that fits


def test_ram_over_with_no_gpu_room_gets_no_such_note() -> None:
    r = run("plan", QWEN, "--no-detect", "--device", "CUDA0=4GiB", "--device", "CPU=16GiB", "--",
            "--cpu-moe", "-c", "32768")
    assert r.returncode == 3 and "can take routed experts from it" not in r.stdout


def test_experts_held_by_an_ot_rule_say_that_fit_keeps_the_rule() -> None:
    """-ot exps=CPU: fit keeps the user's rules, so "fit searches these for you" alone sent the reader to
    a search that leaves every expert on the CPU (fit's own note says so only after it has run)."""
    r = run("plan", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", "CPU=16GiB", "--",
            "-ot", "exps=CPU", "-c", "32768")
    assert r.returncode == 3
    assert (": `offload-planner fit` with the same options and arguments moves them there, but keeps your "
            "-ot rules, which hold 144 routed-expert tensors on the CPU: drop the rule that sends them there "
            "(fit adds --cpu-moe itself) to let it place them (by hand: ") in r.stdout
    fit = run("fit", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", "CPU=16GiB", "--",
              "-c", "32768")
    assert fit.returncode == 0  # the rule dropped, as said: fit places them
    _, lines = _plan("-ngl", "999", "-ot", "exps=CPU")
    assert _hints(lines)[-1] == (FIT + ", but keeps your -ot rules, which hold 174 routed-expert tensors "
                                 "on the CPU: drop the rule that sends them there (fit adds --cpu-moe "
                                 "itself) "
                                 "to let it place them")


def test_ram_over_by_more_than_the_gpus_room_gets_no_such_note() -> None:
    """The demo's 367 GiB of experts in 64 GiB of RAM: CUDA0's 8.46 GiB cannot take the excess."""
    r = run("plan", DEMO, "--no-detect", "--device", "CUDA0=24GiB", "--device", "CPU=64GiB", "--",
            "--cpu-moe", "-c", "32768")
    assert r.returncode == 3 and "can take routed experts from it" not in r.stdout


def test_fit_says_which_gpu_holds_which_layers_experts() -> None:
    """fit's answer said where the experts go only as the command's -ot regex."""
    r = run("fit", DEMO, "--no-detect", "--device", "CUDA0=rtx3090", "--device", "CPU=512GiB,ram=8xDDR5-4800",
            "--", "-c", "32768")
    lines = r.stdout.splitlines()
    at = lines.index("routed experts by device: CUDA0 layer 3, CPU the other 57 layers")
    assert lines[at + 1].startswith("speed estimate (uncalibrated): ")  # between the table and the speed
    assert "blk\\.3\\.ffn_(up|gate|down|gate_up)_exps=CUDA0" in lines[-1]


def test_a_command_that_fit_changes_says_its_speed_is_of_the_command_as_written() -> None:
    """Qwen3-30B as written on a 12 GiB card: the build's --fit runs -c 4096 with experts on the CPU
    (exit 0), while the speed line read "tg 110 t/s" for the command as written, which does not load."""
    r = run("plan", QWEN, "--no-detect", "--device", "CUDA0=12GiB", "--device", "CPU=64GiB")
    assert r.returncode == 0
    speed = next(line for line in r.stdout.splitlines() if line.startswith("speed estimate"))
    assert speed.startswith("speed estimate (uncalibrated) of the command as written (CUDA0 over capacity: "
                            "llama-server's --fit runs the command in the note instead: plan that one for "
                            "its speed): tg ")
    assert "note: --fit is on (this build's default) and changes this command" in r.stdout
    assert "  to make it faster:" not in r.stdout  # hints for a command that does not run as written


def test_a_dense_model_is_told_of_its_weights_and_what_fit_searches_there(tmp_path: Path) -> None:
    """Llama-3.1-70B with -ngl 40 on a 24 GiB card: op offload copies its CPU layers' weights, and fit
    keeps a dense model's layers (its note says so), so the hints speak of weights and of -ub only."""
    from offload_planner.core.synth import BIG_MODELS, write_model

    [llama] = write_model(BIG_MODELS["Llama-3.1-70B-Q4_K_M"], tmp_path / "llama.gguf", header_only=True)
    r = run("plan", str(llama), "--no-detect", "--device", "CUDA0=rtx3090", "--device", "CPU=128GiB", "--",
            "-ngl", "40", "-c", "8192")
    hints = _hints(r.stdout.splitlines())
    assert hints[0].startswith("    pp: op offload takes ") and "the CPU's weights are copied" in hints[0]
    assert hints[-1] == ("    `offload-planner fit` with the same options and arguments searches the -ub (a "
                         "dense model's layers stay where -ngl puts them) for you")
    assert not any("routed experts" in h or "always-active" in h for h in hints)
