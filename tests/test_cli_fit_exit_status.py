"""`fit` exits 1 where nothing fits (DeepSeek-V3 with 128 GiB of RAM) and neither its --help nor the
README said so (plan's --help lists its exit statuses); a script could not tell "nothing fits" from a
crash without reading the text."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
DEEPSEEK = str(ROOT / "resources" / "DeepSeek-V3-Q4_K_M.header.gguf")


def test_fit_says_its_exit_statuses_and_keeps_them() -> None:
    text = " ".join(run_cli("fit", "--help").stdout.split())
    assert ("exit status: 0 a plan that fits was found (its command is the last line); 1 nothing fits the "
            "devices (the closest plan's excess is said); 2 a refused command, file or option (the message "
            "alone, on stderr).") in text
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert ("where nothing fits, the command says which device is over and by how much (exit status 1; 0 "
            "when a plan is found, 2 for a refused command, file or option)") in readme
    gpu = ("--no-detect", "--device", "CUDA0=rtx3090")
    none = run_cli("fit", DEEPSEEK, *gpu, "--device", "CPU=128GiB", "--", "-c", "32768", timeout=120)
    assert none.returncode == 1 and "\nnothing fits these devices: CPU (RAM) over by" in none.stdout
    found = run_cli("fit", DEEPSEEK, *gpu, "--device", "CPU=512GiB", "--", "-c", "32768", timeout=120)
    assert found.returncode == 0 and found.stdout.splitlines()[-1].startswith("llama-server -m ")
    refused = run_cli("fit", DEEPSEEK, *gpu, "--", "-ngl", "abc")
    assert refused.returncode == 2 and refused.stdout == "" and refused.stderr.count("\n") == 1


def test_plan_and_fit_usage_say_where_llama_server_arguments_go() -> None:
    """argparse's usage line stopped at `model`: `fit --help` never showed the `--` that the README's
    usage lines and every example carry, nor what follows it."""
    for command in ("plan", "fit"):
        r = run_cli(command, "--help")
        usage = r.stdout.split("\n\n")[0]
        assert usage.startswith(f"usage: offload-planner {command} [-h]"), usage
        assert usage.endswith(" model -- <llama-server arguments>"), usage
