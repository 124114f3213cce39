"""Hostile values of `plan`'s and `fit`'s newer flags (--prompt, the --device speed keys): refused
at the flag with a message naming it, fast, never a hang or a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import offload_planner

QWEN = str(Path(__file__).resolve().parents[1] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
PACKAGE_ROOT = str(Path(offload_planner.__file__).resolve().parents[1])
NINES = "9" * 400  # float() makes it infinity


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a child with a short timeout: a hang fails the test instead of the suite."""
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}
    return subprocess.run([sys.executable, "-m", "offload_planner", *args], capture_output=True, text=True,
                          timeout=15, env=env)


def refused(r: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-1000:])
    assert "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("offload-planner"), r.stderr
    assert "error: " in last
    for f in fragments:
        assert f in last, last


@pytest.mark.parametrize("command", ["plan", "fit"])
@pytest.mark.parametrize("prompt", ["1000000000000", "2147483647", "0", "-5", "1e12"])
def test_prompt_out_of_range_is_refused_not_walked(command: str, prompt: str) -> None:
    """10^12 tokens were walked micro-batch by micro-batch (hours); now refused at the flag."""
    r = run(command, QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--prompt", prompt)
    refused(r, f"--prompt {prompt!r}", "from 1 to 16777216")


@pytest.mark.parametrize(("key", "named"), [
    ("tflops=inf", "'inf'"), ("tflops=nan", "'nan'"), ("tflops=1e308", "'1e308'"),
    (f"bw={NINES}", "too large"), (f"link={NINES}Gb/s", "too large"),
])
def test_gpu_speed_keys_must_be_finite(key: str, named: str) -> None:
    for command in ("plan", "fit"):
        r = run(command, QWEN, "--no-detect", "--device", f"CUDA0=24GiB,{key}")
        refused(r, "--device 'CUDA0=24GiB,", named)


@pytest.mark.parametrize("decl", [f"CPU=64GiB,threads={NINES}", "CPU=64GiB,ram=99999999999xDDR5-9999999999",
                                  f"CUDA0={NINES}B", f"CUDA0=24GiB,free={NINES}GiB"])
def test_huge_device_figures_are_refused(decl: str) -> None:
    """A 400-digit size or thread count was an OverflowError traceback."""
    r = run("fit", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", decl)
    refused(r, "--device ")


def test_real_fast_devices_are_still_taken() -> None:
    """The bounds sit far above real hardware: HBM at TB/s, a 2000 GB/s bare figure, 400 Gb links."""
    r = run("plan", QWEN, "--no-detect", "--device", "CUDA0=80GiB,bw=3.35TB/s,tflops=989",
            "--device", "CUDA1=24GiB,bw=2000", "--device", "CPU=1TiB,ram=24xDDR5-6400,threads=256")
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this platform")
@pytest.mark.parametrize("args", [["inspect", QWEN, "--json"], ["plan", QWEN, "--no-detect"],
                                  ["fit", QWEN, "--no-detect", "--device", "CUDA0=24GiB"]])
def test_a_full_disk_under_stdout_is_one_clear_line(args: list[str]) -> None:
    """Output redirected to a full disk was an OSError traceback from the print that met it."""
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "offload_planner", *args], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=15,
                           env={**os.environ, "PYTHONPATH": PACKAGE_ROOT})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr == ("offload-planner: error: cannot write the output (standard output): "
                        "No space left on device\n")


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX shell closes the descriptor")
def test_closed_stdout_is_named_not_silently_lost() -> None:
    """`plan >&-` printed nothing and exited as if it had: the plan was lost without a word."""
    r = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "offload_planner", "plan",
                        QWEN, "--no-detect"], capture_output=True, text=True, timeout=15,
                       env={**os.environ, "PYTHONPATH": PACKAGE_ROOT})
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("offload-planner: error: standard output is closed: `plan`"), r.stderr


def _plan_json_with_store(tmp_path: Path, entry: str) -> subprocess.CompletedProcess[str]:
    """`plan --json` with a config folder whose speed store (speed.json) holds ``entry`` for this machine."""
    from offload_planner.backend.speed_store import machine_key

    (tmp_path / "speed.json").write_text(f'{{"machines": {{{json.dumps(machine_key())}: {entry}}}}}')
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT, "OFFLOAD_PLANNER_CONFIG_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "offload_planner", "plan", QWEN, "--no-detect", "--json"],
                          capture_output=True, text=True, timeout=30, env=env)


def _strict_json(text: str) -> dict[str, object]:
    def refuse(token: str) -> object:
        raise ValueError(f"{token} is not JSON")

    out: dict[str, object] = json.loads(text, parse_constant=refuse)
    return out


@pytest.mark.parametrize("ram", ["NaN", "Infinity", "1e308", "true", "1e-300"])
def test_a_damaged_ram_probe_cache_is_measured_again(tmp_path: Path, ram: str) -> None:
    """The cached RAM bandwidth was taken as it was: NaN made `plan --json` print NaN (not JSON),
    true made the RAM 1 GB/s. A figure that is not a plausible positive number is probed again."""
    r = _plan_json_with_store(tmp_path, f'{{"ram_gbs": {ram}, "ram_measured_at": 5}}')
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    _strict_json(r.stdout)
    stored = json.loads((tmp_path / "speed.json").read_text())
    (bw,) = (m["ram_gbs"] for m in stored["machines"].values())
    assert isinstance(bw, float) and 0.01 < bw < 1e5  # measured again and kept


@pytest.mark.parametrize("eff", ['[1]', '{"llama.cpp": {"cpu_compute": NaN}}',
                                 '{"llama.cpp": {"cpu_compute": "x"}}'])
def test_damaged_stored_efficiencies_fall_back_to_the_defaults(tmp_path: Path, eff: str) -> None:
    """A list where the efficiencies' table belongs was an AttributeError traceback; NaN went into
    the estimate. Both now leave the defaults, as an unreadable file does."""
    # a quiet figure of this hour: kept, not measured again (a re-probe reads differently each run)
    now = time.strftime("%Y-%m-%d %H:%M")
    ram = (f'"ram_gbs": 40.0, "ram_measured_at": "{now}", "ram_busy": false, "ram_thread_gbs": 20.0, '
           f'"ram_thread_measured_at": "{now}", "ram_thread_busy": false')
    r = _plan_json_with_store(tmp_path, f'{{{ram}, "efficiencies": {eff}, "efficiencies_at": 3}}')
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    clean = _plan_json_with_store(tmp_path, f'{{{ram}}}')
    assert _strict_json(r.stdout) == _strict_json(clean.stdout)


@pytest.mark.parametrize("where", ["file", "store_is_folder"])
def test_an_unwritable_config_folder_keeps_the_plan(tmp_path: Path, where: str) -> None:
    """A config folder that is a file (or a speed.json that is a folder) was a traceback from the RAM
    probe's save, losing the plan; now the plan is printed and the probe's note says it was not kept."""
    config = tmp_path / "cfg"
    if where == "file":
        config.write_text("not a folder")
    else:
        (config / "speed.json").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT, "OFFLOAD_PLANNER_CONFIG_DIR": str(config)}
    for command in (["plan", QWEN, "--no-detect", "--json"],
                    ["fit", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--json"]):
        r = subprocess.run([sys.executable, "-m", "offload_planner", *command], capture_output=True,
                           text=True, timeout=30, env=env)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        store = config / "speed.json"
        if where == "file":
            assert f"not kept: {store}: cannot write the speed store" in r.stdout
        elif command[0] == "plan":  # a folder is no store: set aside (read_config_file), a new one kept
            assert f"{store} could not be read (not a regular file): kept as {store}.damaged" in r.stdout
        _strict_json(r.stdout)
    left = sorted(p.name for p in tmp_path.rglob("*"))  # no temporary file behind
    assert left == (["cfg"] if where == "file" else ["cfg", "speed.json", "speed.json.damaged"])
    if where != "file":
        assert (config / "speed.json").is_file() and (config / "speed.json.damaged").is_dir()


DEEPSEEK = str(Path(__file__).resolve().parents[1] / "resources" / "DeepSeek-V3-Q4_K_M.header.gguf")


def _children(pid: int) -> list[int]:
    """Live (not zombie) children of ``pid``, from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; the fork is Linux-only")
def test_ctrl_c_during_fit_is_one_line_and_leaves_no_child() -> None:
    """Ctrl-C while fit's forked --fit child ran was a KeyboardInterrupt traceback (exit by SIGINT);
    now one line, exit 130, and the child is gone."""
    import signal
    import time

    devices = [a for i in range(4) for a in ("--device", f"CUDA{i}=24GiB")]
    p = subprocess.Popen([sys.executable, "-m", "offload_planner", "fit", DEEPSEEK, "--no-detect",
                          "--device", "CPU=512GiB", *devices], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": PACKAGE_ROOT}, start_new_session=True)
    deadline = time.monotonic() + 10
    kids: list[int] = []
    while not kids and p.poll() is None and time.monotonic() < deadline:  # the search has begun
        kids = _children(p.pid)
        time.sleep(0.01)
    os.killpg(p.pid, signal.SIGINT)  # what the terminal does on Ctrl-C: the whole group
    _, err = p.communicate(timeout=10)
    if p.returncode == 0:
        pytest.skip("fit finished before the signal arrived")
    assert (p.returncode, err) == (130, "offload-planner: interrupted\n")
    time.sleep(0.1)
    assert not [k for k in kids if _alive(k)]  # the child went with its parent


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("command", ["plan", "fit", "gui"])
def test_a_device_declared_twice_is_refused(command: str, tmp_path: Path) -> None:
    """`--device CUDA0=24GiB --device cuda0=12GiB`: the last silently won; which was meant is not ours
    to guess. The window refuses it before it opens."""
    extra = ["--screenshot", str(tmp_path / "shot.png")] if command == "gui" else ["--no-detect"]
    r = run(command, QWEN, *extra, "--device", "CUDA0=24GiB", "--device", "cuda0=12GiB")
    refused(r, "--device 'cuda0=12GiB': CUDA0 is already declared by --device 'CUDA0=24GiB'")
    assert r.stderr.count("\n") == 1


@pytest.mark.parametrize("command", ["plan", "fit"])
def test_more_gpus_than_llama_cpp_takes_are_refused(command: str) -> None:
    """40 declared GPUs made a command with -ts of 40 values, which llama-server (and our own parser
    of its arguments) refuses: llama_max_devices() is 16, and common/arg.cpp refuses a -ts of 16
    values or more, so 16 GPUs (-ts of 16 values) were refused by llama-server too."""
    devices = [a for i in range(17) for a in ("--device", f"CUDA{i}=24GiB")]
    r = run(command, QWEN, "--no-detect", *devices)
    refused(r, "--device: 17 GPUs declared (CUDA0 ... CUDA16)", "at most 15")
    r = run(command, QWEN, "--no-detect", *devices[:32])
    refused(r, "--device: 16 GPUs declared (CUDA0 ... CUDA15)", "at most 15")
    ok = run("plan", QWEN, "--no-detect", *devices[:30])  # 15 are taken
    assert ok.returncode == 0, ok.stderr
    ts = next(a for a in ok.stdout.split("\n") if a.startswith("llama-server")).split(" -ts ")[1].split()[0]
    assert len(ts.split(",")) == 15  # a -ts llama-server takes


def test_fit_refuses_mtp_on_a_model_without_mtp_layers(small_models: dict[str, Path]) -> None:
    """`fit ... -- --spec-type draft-mtp` on a model without NextN layers printed a 'fastest' command
    llama-server exits on at load (plan warned; fit showed no warning). A model with them still fits."""
    r = run("fit", str(small_models["qwen3moe"]), "--no-detect", "--device", "CUDA0=24GiB", "--",
            "--spec-type", "draft-mtp")
    refused(r, f"--spec-type draft-mtp on {small_models['qwen3moe']}: llama-server exits at load",
            "nextn_predict_layers = 0")
    assert r.stderr.count("\n") == 1 and not r.stdout
    ok = run("fit", str(small_models["deepseek2-mtp"]), "--no-detect", "--device", "CUDA0=24GiB", "--",
             "--spec-type", "draft-mtp")
    assert ok.returncode == 0 and "--spec-type draft-mtp" in ok.stdout, ok.stderr


@pytest.mark.parametrize("command", ["plan", "fit"])
def test_a_prompt_of_too_many_micro_batches_is_refused(command: str) -> None:
    """`--prompt 1000000 -- -ub 1`: a million steps of the estimate's micro-batch loop (10 s here;
    16M tokens took minutes). Refused naming --prompt and -ub; -b caps -ub as in llama.cpp."""
    r = run(command, QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--prompt", "1000000", "--", "-ub", "1")
    refused(r, "--prompt 1000000 in micro-batches of -ub 1 is 1000000 micro-batches, more than the 32768")
    r = run(command, QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--prompt", "40000", "--", "-b", "1")
    refused(r, "--prompt 40000 in micro-batches of -ub 1 is 40000")
    ok = run(command, QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--prompt", "32768", "--", "-ub", "1",
             "-b", "1")
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("size", ["99999x99999", "8193x800", "1280x8193"])
def test_a_screenshot_too_large_to_draw_is_refused(size: str, tmp_path: Path) -> None:
    """`gui --screenshot x.png --size 99999x99999` died of a segmentation fault (exit 139) painting a
    40 GB image; now refused before Qt starts, naming --size."""
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT, "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run([sys.executable, "-m", "offload_planner", "gui", QWEN, "--screenshot",
                        str(tmp_path / "x.png"), "--size", size], capture_output=True, text=True, timeout=60,
                       env=env)
    expected = (f"offload-planner: error: --size {size!r}: larger than the largest screenshot drawn, "
                "8192x8192\n")
    assert (r.returncode, r.stderr) == (2, expected)
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("command", ["plan", "fit"])
@pytest.mark.parametrize("flag", ["-nkvo", "--no-kv-offload"])
def test_ik_no_kv_offload_is_written_once(command: str, flag: str) -> None:
    """ik_llama.cpp's -nkvo (its own canonical key, --no-kv-offload) was kept verbatim beside the one
    the plan writes: `... -fa on -nkvo -nkvo`."""
    r = run(command, QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--backend", "ik_llama.cpp", "--", flag)
    assert r.returncode == 0, r.stderr
    cmd = r.stdout.strip().splitlines()[-1].split()
    assert cmd[0] == "llama-server" and cmd.count("-nkvo") + cmd.count("--no-kv-offload") == 1, cmd


@pytest.mark.parametrize("command", ["plan", "fit"])
@pytest.mark.parametrize(("flag", "value", "named"), [
    ("-c", "-1", "-c/--ctx-size -1"), ("-c", "-5", "-c/--ctx-size -5"),
    ("-b", "-1", "-b/--batch-size -1"), ("-ub", "-1", "-ub/--ubatch-size -1"),
])
def test_a_negative_context_size_is_refused_not_walked(command: str, flag: str, value: str,
                                                       named: str) -> None:
    """llama-server's parser takes any int for -c, -b and -ub, and the library reads a negative one as
    uint32_t (-1: 4294967295); the speed estimate walked the prompt in micro-batches of -1 tokens and
    never ended (the command-line fuzz test found `-c -1`)."""
    r = run(command, QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--", flag, value)
    refused(r, named, "4294967")


def test_fit_with_ik_dflash_says_what_it_leaves_out_and_refuses_what_stops_ik(
        small_models: dict[str, Path]) -> None:
    """`fit --backend ik_llama.cpp -- -md D --spec-type dflash` was refused with the plan's note on what
    the projection leaves out of a dflash draft, under the prefix '--spec-type draft-mtp on': fit took
    every speculative note for a refusal (found by ikspec2). The note is printed with the fitted plan; a
    draft ik stops loading (-sm graph on one -devd GPU) is refused, naming the model, not draft-mtp."""
    draft = str(small_models["llama-draft"])
    base = ("fit", str(small_models["llama"]), "--no-detect", "--backend", "ik_llama.cpp",
            "--device", "CUDA0=24GiB", "--device", "CUDA1=24GiB", "--")
    ok = run(*base, "-md", draft, "--spec-type", "dflash")
    assert ok.returncode == 0, ok.stderr
    assert "--spec-type dflash: the draft context is projected as a plain draft's" in ok.stdout
    r = run(*base, "-sm", "graph", "-devd", "CUDA0", "-md", draft, "--spec-type", "draft")
    refused(r, f"{small_models['llama']}: ik_llama.cpp stops loading the draft model llama-draft.gguf")
    assert "draft-mtp" not in r.stderr
