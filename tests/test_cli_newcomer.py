"""The command line as an LM Studio or llama.cpp user first types it: a typo in one of our own flags,
a device declared with more free memory than it has, a margin that leaves nothing, a device name that
is not one. Each is refused alone (exit 2, nothing on stdout) with a message that names the flag and
says what to do."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.test_cli_plan_input import QWEN, refused, run

from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.plan_file import PlanFile, plan_json

# --- free= and margin= against the size -----------------------------------------------------------


@pytest.mark.parametrize("command", ["plan", "fit", "launch"])
@pytest.mark.parametrize(("decl", "said"), [
    ("CUDA0=24GiB,free=30GiB", "free=30.00 GiB is more than the device's size 24.00 GiB"),
    ("CUDA0=rtx3090,free=30GiB", "free=30.00 GiB is more than the device's size 24.00 GiB"),
    ("CPU=64GiB,free=100GiB", "free=100.00 GiB is more than the device's size 64.00 GiB"),
])
def test_free_beyond_the_size_is_refused(command: str, decl: str, said: str) -> None:
    """`free` is part of the size: 30 GiB free on a 24 GiB card was taken, and the plan was made
    against 30 GiB (the table's capacity column said 30.00)."""
    err = refused(run(command, QWEN, "--no-detect", "--device", decl, "--device", "CUDA1=24GiB",
                      "--", "-c", "4096"))
    assert f"--device {decl!r}" in err and said in err and "lower free= or raise the size" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("command", ["plan", "fit", "launch", "gui"])
@pytest.mark.parametrize(("decl", "said"), [
    ("CUDA0=24GiB,,bw=900GB/s", "field 2 is empty (nothing between the commas at character 12)"),
    ("CUDA0=24GiB,bw=900GB/s,", "field 3 is empty (a comma at the end)"),
    ("CUDA0=,24GiB", "field 1 is empty (a comma right after '=')"),
    ("CUDA0=rtx3090, ,free=20GiB", "field 2 is empty (nothing between the commas at character 14)"),
])
def test_an_empty_device_field_is_refused_naming_its_place(command: str, decl: str, said: str) -> None:
    """An empty field was dropped without a word: `CUDA0=24GiB,,bw=900GB/s` planned as if it were
    written once, hiding a field lost in an edit. Refused in one line naming the flag, the field's
    number and where it is, in every command that takes --device (the window's before Qt starts)."""
    head = [command] + ([] if command == "gui" else [QWEN, "--no-detect"])
    err = refused(run(*head, "--device", decl, *([] if command == "gui" else ["--", "-c", "4096"])))
    assert err == f"offload-planner: error: --device {decl!r}: {said}: remove the extra comma\n"


def test_the_window_refuses_free_beyond_the_size_before_anything_else() -> None:
    err = refused(run("gui", "--device", "CUDA0=24GiB,free=30GiB"))
    assert "--device 'CUDA0=24GiB,free=30GiB'" in err and "more than the device's size" in err


@pytest.mark.parametrize(("decl", "said"), [
    ("CUDA0=24GiB,margin=24GiB", "margin=24.00 GiB leaves nothing of the device's size 24.00 GiB"),
    ("CUDA0=24GiB,free=10GiB,margin=12GiB", "leaves nothing of the device's free memory 10.00 GiB"),
])
def test_a_margin_that_leaves_nothing_is_refused(decl: str, said: str) -> None:
    err = refused(run("plan", QWEN, "--no-detect", "--device", decl, "--", "-c", "4096"))
    assert f"--device {decl!r}" in err and said in err


@pytest.mark.parametrize("decl", ["CUDA0=24GiB,free=24GiB", "CUDA0=24GiB,free=0GiB",
                                  "CUDA0=24GiB,margin=2GiB", "CUDA0=24GiB,free=10GiB,margin=9GiB"])
def test_free_up_to_the_size_and_a_margin_below_it_are_taken(decl: str) -> None:
    d = parse_device_decl(decl)
    assert d.total == 24 * 1024**3


def _launch_edited_plan(tmp_path: Path, edit: Callable[[dict[str, Any]], object] = lambda d: None,
                        text: Callable[[str], str] = lambda t: t) -> tuple[Path, str]:
    """A plan of QWEN on a 24 GiB GPU saved, edited by hand (``edit`` on its JSON data, then ``text``
    on its text), and given to `launch` in a child: the file's path and the error it printed."""
    plan = plan_from_args(open_model(QWEN), DeviceSet(parse_device_decl("CPU=64GiB"),
                                                      (parse_device_decl("CUDA0=24GiB"),)),
                          argparse.Namespace(ctx_size=4096))
    data = plan_json(PlanFile.of(plan))
    edit(data)
    path = tmp_path / "edited.plan.json"
    path.write_text(text(json.dumps(data)))
    return path, refused(run("launch", str(path), "--no-detect", "--server", "/bin/false"))


def test_a_plan_file_with_free_beyond_total_is_refused_naming_the_field(tmp_path: Path) -> None:
    """A hand-edited plan file's GPU with 30 GiB free of 24 GiB: `launch FILE.plan.json` names the
    file and the field (it was taken, and the plan made against 30 GiB)."""
    path, err = _launch_edited_plan(tmp_path, lambda d: d["devices"]["gpus"][0].update(free=30 * 1024**3))
    assert str(path) in err and "$.devices.gpus[0].free" in err and "more than the device's total" in err


def test_a_plan_file_with_a_margin_as_large_as_the_gpu_is_refused_naming_the_field(tmp_path: Path) -> None:
    """A hand-edited plan file's 24 GiB GPU with a 24 GiB margin (`--device` refuses it; the file
    took it and planned a GPU with no room): `launch FILE.plan.json` names the file and the field."""
    path, err = _launch_edited_plan(tmp_path, lambda d: d["devices"]["gpus"][0].update(margin=24 * 1024**3))
    assert str(path) in err and "$.devices.gpus[0].margin" in err and "leaves nothing" in err


def test_a_plan_file_with_a_field_given_twice_is_refused_naming_it(tmp_path: Path) -> None:
    """A hand-edited plan file with "free" written twice in a GPU (json keeps the last one silently;
    `--device` refuses a field given twice): `launch FILE.plan.json` names the file and the key."""
    twice = '"free": 1024, "free": '
    path, err = _launch_edited_plan(tmp_path, text=lambda t: t.replace('"free": ', twice, 1))
    assert str(path) in err and "'free' is given twice" in err


# --- a device name that is not one ----------------------------------------------------------------


def test_an_unknown_device_name_names_the_flag() -> None:
    err = refused(run("plan", QWEN, "--no-detect", "--device", "GPU0=24GiB", "--", "-c", "4096"))
    assert "--device 'GPU0=24GiB': unknown device name 'GPU0'" in err and "CUDA0" in err


# --- typos of our own options ---------------------------------------------------------------------


@pytest.mark.parametrize(("args", "meant"), [
    (("plan", QWEN, "--devce", "CUDA0=24GiB"), "did you mean --device for --devce?"),
    (("plan", QWEN, "--promt", "512"), "did you mean --prompt for --promt?"),
    (("fit", QWEN, "--goall", "tg"), "did you mean --goal for --goall?"),
    (("inspect", QWEN, "--jsn"), "did you mean --json for --jsn?"),
])
def test_a_typo_of_our_own_option_names_the_option_it_meant(args: tuple[str, ...], meant: str) -> None:
    """`--devce CUDA0=24GiB` was told to go after `--` as a llama-server argument (which llama-server
    would refuse in turn)."""
    err = refused(run(*args))
    assert meant in err and f"offload-planner {args[0]} --help" in err
    if args[0] == "plan":
        assert "llama-server arguments go after" not in err


def test_a_typo_beside_a_server_flag_gets_both_hints() -> None:
    err = refused(run("plan", QWEN, "--no-detct", "--cpu-moe"))
    assert "did you mean --no-detect for --no-detct?" in err
    assert "llama-server arguments go after `--`: offload-planner plan MODEL [options] -- --cpu-moe" in err


# --- help -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["plan", "fit", "launch", "gui"])
def test_every_device_help_names_cards_keys_and_free(command: str) -> None:
    """`plan --help` said NAME=SIZE[,free=SIZE] while plan takes catalogue cards and speed keys as
    fit does; the four commands now say the same."""
    r = run(command, "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "NAME=SIZE|CARD[,key=value]" in text
    for word in ("CUDA0=rtx3090", "free=SIZE", "at most the size", "margin=SIZE", "bw=936GB/s", "pcie=4x16"):
        assert word in text, (command, word)


# --- commands that cannot start -------------------------------------------------------------------


def test_fit_without_any_gpu_says_to_declare_one() -> None:
    """"fit needs every GPU's size" read oddly on a machine with no GPU and no --device."""
    err = refused(run("fit", QWEN, "--no-detect", "--", "-c", "4096"))
    assert "fit places tensors on GPUs and there is none: declare one with --device" in err
    assert "--device CUDA0=rtx3090" in err and err.count("\n") == 1


def test_launch_with_a_wrong_server_path_names_the_option(tmp_path: Path) -> None:
    """`--server /nonexistent` printed "offload-planner: llama-server not found; looked in:
    /nonexistent": no "error:", no option named, nothing said of what to give."""
    missing = tmp_path / "nowhere"
    err = refused(run("launch", QWEN, "--no-detect", "--server", str(missing), "--", "-c", "512"))
    assert err.startswith(f"offload-planner: error: --server '{missing}': no llama-server executable there")
    assert "give the executable or the folder holding it" in err and err.count("\n") == 1


@pytest.mark.parametrize("folder", [False, True])
def test_a_server_that_is_not_executable_says_so(tmp_path: Path, folder: bool) -> None:
    """A llama-server copied without its x bit (unzipped, or built on a mounted drive) was "no
    llama-server executable there (looked for PATH)": the file is there, so the path looked wrong
    (newcomer4)."""
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o644)
    given = tmp_path if folder else exe
    err = refused(run("launch", QWEN, "--no-detect", "--server", str(given), "--", "-c", "512"))
    assert err == (f"offload-planner: error: --server '{given}': {exe} is a file but not executable: make it "
                   f"one (chmod +x {exe}) or give the llama-server executable\n"), err


def test_the_programs_help_gives_first_steps() -> None:
    """`offload-planner --help` listed five commands and no way to start: it now says what running
    it bare does and gives a first `plan` and `fit` line."""
    r = run("--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "Without a command, the window opens" in text
    assert "offload-planner plan MODEL.gguf --device CUDA0=24GiB -- -ngl 999 --cpu-moe" in text
    assert "offload-planner fit MODEL.gguf --device CUDA0=rtx3090" in text


@pytest.mark.parametrize(("decl", "said"), [
    ("CUDA0=24GiB,free=20GiB,free=22GiB", "free= is given twice: give each field once"),
    ("CUDA0=24GiB,bw=900GB/s,bandwidth=100GB/s", "bandwidth= is given twice (bandwidth= is bw=)"),
    ("CUDA0=24GiB,22GiB", "'22GiB' is a second size: the size comes first, the free memory as free=22GiB"),
    ("CUDA0=-24GiB", "not a size: '-24GiB' (accepted: 24GiB"),
])
def test_a_device_field_twice_or_a_second_size_is_refused_with_what_to_write(decl: str, said: str) -> None:
    """The last of two free= (or bw=) silently won; a second bare size was "unknown field '22GiB'"; a
    negative size listed the 35 catalogue cards as if it were a card name."""
    err = refused(run("plan", QWEN, "--no-detect", "--device", decl, "--", "-c", "4096"))
    assert f"--device {decl!r}: {said}" in err and "rtx3090" not in err


def test_a_screenshot_run_prints_one_clean_line(tmp_path: Path) -> None:
    """`offload-planner README.md --screenshot x.png` printed its error twice (the loader's failure
    and the window's error dialog) after Qt's offscreen "This plugin does not support
    propagateSizeHints()", which every good screenshot run printed too."""
    readme = Path(QWEN).parents[1] / "README.md"
    bad = run(str(readme), "--screenshot", str(tmp_path / "bad.png"))
    assert bad.returncode == 1
    assert bad.stderr.splitlines() == [
        f"offload-planner: error: {readme} at byte 0: not a GGUF file (magic b'# Of', expected b'GGUF')"]
    good = run("gui", QWEN, "--screenshot", str(tmp_path / "good.png"), "--size", "1024x640")
    assert good.returncode == 0 and good.stdout == f"{tmp_path / 'good.png'}: 1024x640\n"
    assert good.stderr == ""


@pytest.mark.parametrize(("typed", "meant"), [("plna", "plan"), ("inpsect", "inspect"), ("fitt", "fit")])
def test_a_mistyped_command_is_named(typed: str, meant: str) -> None:
    """`offload-planner plna MODEL` went to the window with 'plna' as the model: "unrecognized
    arguments: MODEL" (or, without a display, "no display")."""
    err = refused(run(typed, QWEN, "--", "-c", "4096"))
    assert err == (f"offload-planner: error: unknown command {typed!r}: did you mean {meant}? (commands: "
                   "inspect, gui, plan, launch, fit; `offload-planner MODEL` opens the window)\n")


def test_a_model_path_still_opens_the_window(tmp_path: Path) -> None:
    shot = tmp_path / "w.png"
    r = run(QWEN, "--screenshot", str(shot), "--size", "1024x640")
    assert r.returncode == 0 and shot.is_file(), r.stderr


# --- a card without its device, a card's number without its name (newcomer4) ----------------------


@pytest.mark.parametrize("command", ["plan", "fit"])
@pytest.mark.parametrize(("decl", "said"), [
    ("rtx3090", "a card is declared on a device name: --device CUDA0=rtx3090"),
    ("RTX-4090", "a card is declared on a device name: --device CUDA0=rtx4090"),
    ("rx7900xtx", "--device ROCm0=rx7900xtx"),
    ("CUDA0=3090", "size '3090' has no unit: write e.g. 3090GiB"),
    ("CUDA1=6000", "for the card: CUDA1=rtxa6000 or CUDA1=rtxpro6000"),
])
def test_a_card_written_as_a_newcomer_writes_it_is_named(command: str, decl: str, said: str) -> None:
    """`--device rtx3090` (the help's CARD without the NAME= before it) was only "expected NAME=SIZE,
    e.g. CUDA0=24GiB", and `CUDA0=3090` only suggested 3090GiB: each now names the declaration meant."""
    err = refused(run(command, QWEN, "--no-detect", "--device", decl, "--", "-c", "4096"))
    assert f"--device {decl!r}" in err and said in err, err
    if decl == "CUDA0=3090":
        assert err.rstrip().endswith("for the card: CUDA0=rtx3090"), err


def test_a_bare_size_matching_no_card_keeps_its_message() -> None:
    err = refused(run("plan", QWEN, "--no-detect", "--device", "CUDA0=24", "--", "-c", "4096"))
    assert err.rstrip().endswith("size '24' has no unit: write e.g. 24GiB (accepted: 24GiB, 24G (both 24 x "
                                 "1024^3 bytes), 24GB (24 x 1000^3), 8000MiB, 1TiB or 4096B)"), err


@pytest.mark.parametrize(("args", "said"), [
    (["plan", QWEN, "--goal", "tg"], "(--goal is an option of `offload-planner fit`, not of plan)"),
    (["plan", QWEN, "--allow-kv-quant", "-ngl", "99"],
     "(--allow-kv-quant is an option of `offload-planner fit`, not of plan; llama-server arguments go after "
     "`--`: offload-planner plan MODEL [options] -- -ngl 99)"),
    (["inspect", QWEN, "--device", "CUDA0=24GiB"],
     "(--device is an option of `offload-planner gui, plan, launch and fit`, not of inspect)"),
    (["fit", QWEN, "--screenshot=x.png"], "(--screenshot is an option of `offload-planner gui`, not of fit)"),
])
def test_another_commands_option_is_named_as_its(args: list[str], said: str) -> None:
    """`plan MODEL --goal tg` (fit's option) was told "llama-server arguments go after `--`: ... --
    --goal tg", which llama-server refuses in turn; inspect's --device had no hint at all (newcomer4)."""
    err = refused(run(*args))
    assert err.rstrip().endswith(said), err
    assert [x for x in err.splitlines() if "error:" in x] == [err.splitlines()[-1]], err  # one error line


@pytest.mark.parametrize("command", ["inspect", "plan", "fit"])
def test_a_download_folder_named_instead_of_its_file_names_the_file(command: str, tmp_path: Path) -> None:
    """A newcomer passes the folder a model was downloaded into: "is a directory, not a GGUF file"
    alone; now the message names the file to give, a split model's first part before its others and
    before a projector (newcomer4)."""
    folder = tmp_path / "DeepSeek-V3-Q4_K_M"
    folder.mkdir()
    for name in ("mmproj-F16.gguf", "DeepSeek-V3-Q4_K_M-00002-of-00002.gguf",
                 "DeepSeek-V3-Q4_K_M-00001-of-00002.gguf", "README.md"):
        (folder / name).write_bytes(b"")
    err = refused(run(command, str(folder), *([] if command == "inspect" else ["--no-detect"])))
    first = folder / "DeepSeek-V3-Q4_K_M-00001-of-00002.gguf"
    assert err == (f"offload-planner: error: {folder}: is a directory, not a GGUF file: name one of its "
                   f".gguf files, e.g. {first} (3 .gguf files)\n"), err


@pytest.mark.parametrize("command", ["plan", "fit"])
def test_a_model_flag_naming_another_file_is_said(command: str, tmp_path: Path) -> None:
    """`plan A.gguf -- -m B.gguf -ngl 99` (a command pasted for another model) planned A and dropped
    the -m without a word; now a note names both. -m naming MODEL itself, by another spelling of its
    path, gives none (newcomer4)."""
    devices = ["--device", "CUDA0=24GiB"]
    r = run(command, QWEN, "--no-detect", *devices, "--", "-m", str(tmp_path / "B.gguf"), "-c", "4096")
    assert r.returncode == 0, r.stderr
    other = tmp_path / "B.gguf"
    assert (f"note: -m {other} is not the model planned: the plan and its command are of {QWEN} (the MODEL "
            "argument); to plan the other, give it as MODEL") in r.stdout.splitlines()
    same = str(Path(QWEN).parent / ".." / Path(QWEN).parent.name / Path(QWEN).name)
    r = run(command, QWEN, "--no-detect", *devices, "--", "-m", same, "-c", "4096")
    assert r.returncode == 0 and "is not the model planned" not in r.stdout, r.stdout


@pytest.mark.parametrize("command", ["plan", "fit", "gui"])
@pytest.mark.parametrize(("name", "said"), [
    ("CUDA01", "'CUDA01': llama.cpp names it CUDA1 (no leading zero)"),
    ("CUDA", "'CUDA' needs its index, as llama.cpp names devices: CUDA0, CUDA1, ..."),
    ("CUDA16", "'CUDA16': llama.cpp numbers at most 16 devices (llama_max_devices): CUDA0 ... CUDA15"),
    ("Vulkan" + "9" * 30, "llama.cpp numbers at most 16 devices"),
])
def test_a_gpu_name_llama_cpp_never_has_is_refused(command: str, name: str, said: str) -> None:
    """`--device CUDA01=24GiB` planned a GPU named CUDA01 (its -ot rules named a buffer type llama-server
    refuses), `CUDA=24GiB` one named CUDA, `CUDA16` a 17th device (newcomer4)."""
    head = [command] + ([] if command == "gui" else [QWEN, "--no-detect"])
    err = refused(run(*head, "--device", f"{name}=24GiB"))
    assert err.startswith(f"offload-planner: error: --device '{name}=24GiB': ") and said in err, err
    assert err.count("\n") == 1


def test_a_plan_file_gpu_named_cuda01_is_refused(tmp_path: Path) -> None:
    model = open_model(QWEN)
    gpus = (parse_device_decl("CUDA0=24GiB"),)
    plan = plan_from_args(model, DeviceSet(parse_device_decl("CPU=64GiB"), gpus),
                          argparse.Namespace(ctx_size=4096))
    data: dict[str, Any] = plan_json(PlanFile.of(plan))
    data["devices"]["gpus"][0]["name"] = "CUDA01"
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    err = refused(run("launch", str(path), "--no-detect"))
    assert err == (f"offload-planner: error: {path}: bad field $.devices.gpus[0].name: 'CUDA01': llama.cpp "
                   "names it CUDA1 (no leading zero)\n"), err


# --- a web page or an error saved as the model (newcomer4) -----------------------------------------


def test_a_web_page_saved_as_the_model_says_so(tmp_path: Path) -> None:
    """`curl -o model.gguf` of a gated repository saves its login page: "not a GGUF file (magic
    b'<!DO', expected b'GGUF')" alone; now the message quotes the start of the text. A binary
    file of another format keeps its message byte for byte."""
    page = tmp_path / "model.gguf"
    page.write_text("<!DOCTYPE html>\n<html><body>Access to model org/m is restricted.</body></html>")
    err = refused(run("plan", str(page), "--no-detect"))
    assert err == (f"offload-planner: error: {page} at byte 0: not a GGUF file (magic b'<!DO', expected "
                   "b'GGUF'); it starts with text ('<!DOCTYPE html> <html><body>Access to model org/m is "
                   "restric'...): a web page or an error message, not a model\n"), err
    ggml = tmp_path / "old.bin"
    ggml.write_bytes(b"GGML" + bytes(60))
    err = refused(run("inspect", str(ggml)))
    assert err == (f"offload-planner: error: {ggml} at byte 0: not a GGUF file (magic b'GGML', expected "
                   "b'GGUF')\n")


def test_a_hugging_face_blob_link_names_the_download_link(tmp_path: Path) -> None:
    """The browser's address of a file on Hugging Face (.../blob/main/x.gguf) is its web page; the
    link that downloads it is .../resolve/main/x.gguf. A local server stands in for the hub
    ($HF_ENDPOINT), serving a page at the blob address."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    blob = tmp_path / "org" / "m-GGUF" / "blob" / "main"
    blob.mkdir(parents=True)
    (blob / "m-Q4_K_M.gguf").write_text("<!DOCTYPE html><html><head><title>m-Q4_K_M.gguf</title></head>")

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        url = f"{base}/org/m-GGUF/blob/main/m-Q4_K_M.gguf"
        err = refused(run("inspect", url, env={"HF_ENDPOINT": base}))
    finally:
        srv.shutdown()
        srv.server_close()
    assert err.rstrip().endswith("; a Hugging Face /blob/ link is the file's web page: give the download "
                                 f"link, {base}/org/m-GGUF/resolve/main/m-Q4_K_M.gguf"), err


def test_a_backend_flooding_its_version_is_refused_at_once(tmp_path: Path) -> None:
    """`--backend PROGRAM` runs PROGRAM --version: one printing without end (yes) was read into memory
    for the whole 30 s timeout (gigabytes), then named by the guard's own command line (newcomer4)."""
    import time

    flood = tmp_path / "llama-server"
    flood.write_text("#!/bin/sh\nexec yes llama-server\n")
    flood.chmod(0o755)
    t0 = time.monotonic()
    err = refused(run("plan", QWEN, "--no-detect", "--backend", str(flood)))
    assert time.monotonic() - t0 < 20
    assert err == (f"offload-planner: error: --backend '{flood}': cannot run it: printed more than 4 MiB for "
                   "--version (not a llama-server?)\n"), err


@pytest.mark.parametrize("command", ["plan", "fit"])
def test_a_cards_size_beyond_its_memory_is_refused(command: str) -> None:
    """`CUDA0=rtx3090,100TiB` planned a 100 TiB RTX 3090 (the size after a card is for cards sold in
    several sizes, or to give less); a size up to the card's is still taken (newcomer4)."""
    err = refused(run(command, QWEN, "--no-detect", "--device", "CUDA0=rtx3090,100TiB", "--", "-c", "4096"))
    assert err == ("offload-planner: error: --device 'CUDA0=rtx3090,100TiB': 100TiB is more than the NVIDIA "
                   "GeForce RTX 3090's 24 GiB: give at most that (free= for the part unused now)\n"), err
    ok = run("plan", QWEN, "--no-detect", "--json", "--device", "CUDA0=rtx3090,20GiB", "--", "-c", "4096")
    assert ok.returncode == 0, ok.stderr
    gpu = next(d for d in json.loads(ok.stdout)["devices"] if d["name"] == "CUDA0")
    assert gpu["capacity_bytes"] == 20 * 1024**3, gpu


@pytest.mark.parametrize("command", ["plan", "fit"])
def test_more_rpc_servers_than_llama_cpp_takes_are_refused(command: str) -> None:
    """Twenty --rpc servers were planned as RPC0..RPC19 (llama.cpp reads 16 split values for its
    devices, past its array beyond 16, and its -ts takes at most 15), where 16 --device GPUs are
    refused; now the same bound counts the --rpc servers (newcomer4)."""
    many = ",".join(f"127.0.0.1:{5000 + i}" for i in range(15))
    err = refused(run(command, QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--", "--rpc", many))
    assert err == ("offload-planner: error: 16 devices (15 --rpc servers, 1 GPU(s)); at most 15: llama.cpp's "
                   "-ts takes fewer values than its 16 devices (llama_max_devices)\n"), err


# --- the speed line of a plan that does not fit ---------------------------------------------------------


@pytest.mark.parametrize(("devices", "server", "over"), [
    (("CUDA0=12GiB", "CPU=512GiB"), ("-ngl", "999"), "CUDA0"),
    (("CPU=4GiB",), ("-ngl", "0"), "CPU"),
])
def test_a_plan_over_capacity_gives_its_speed_as_if_it_fit(devices: tuple[str, ...],
                                                           server: tuple[str, ...], over: str) -> None:
    """`plan` printed "speed estimate (uncalibrated): tg 16.2 t/s" for DeepSeek-V3 all on one 24 GiB
    GPU, 354 GiB over: a newcomer read a speed for a plan llama-server does not load, the OVER mark
    and the warning lines away. The line says "if it fit", as the window's speed line does."""
    decls = [a for d in devices for a in ("--device", d)]
    r = run("plan", QWEN, "--no-detect", *decls, "--", *server, "-c", "4096")
    assert r.returncode == 3, r.stderr
    speed = next(ln for ln in r.stdout.splitlines() if ln.startswith("speed estimate"))
    assert speed.startswith(f"speed estimate (uncalibrated) if it fit ({over} over capacity): tg ")


def test_a_plan_that_fits_gives_its_speed_plainly() -> None:
    r = run("plan", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", "CPU=512GiB",
            "--", "-ngl", "999", "--cpu-moe", "-c", "4096")
    assert r.returncode == 0, r.stderr
    assert "\nspeed estimate (uncalibrated): tg " in r.stdout and "if it fit" not in r.stdout


def test_a_prompt_past_the_context_names_only_what_was_given() -> None:
    """`plan MODEL -- -c 32k` (read as 32 cells) noted "--depth 0 + --prompt 4096 tokens exceed the
    context of 256 cells a sequence" to a user who had given neither --depth nor --prompt."""
    r = run("plan", QWEN, "--no-detect", "--", "-c", "32k", "-ngl", "0")
    said = [ln for ln in r.stdout.splitlines() if "exceed" in ln]
    assert said == ["note: the speed estimate's 4096-token prompt (--prompt) exceeds the context of 256 "
                    "cells a sequence: llama-server would refuse such a request (the estimate is computed "
                    "anyway; --prompt N sets another)"], r.stdout
    r = run("plan", QWEN, "--no-detect", "--depth", "3000", "--prompt", "2000", "--",
            "-c", "4096", "-np", "1")
    assert [ln for ln in r.stdout.splitlines() if "exceed" in ln] == [
        "note: --depth 3000 + --prompt 2000 tokens exceed the context of 4096 cells a sequence: llama-server "
        "would refuse such a request (the estimate is computed anyway)"]


def test_explain_says_what_a_graph_split_is() -> None:
    """`plan` printed "graph splits: 97 per token, 1.99 ms" and nothing said what one is; `--explain`
    says it on that line, and the plain output keeps its line as it was."""
    args = ("plan", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", "CPU=512GiB")
    server = ("--", "-ngl", "999", "--cpu-moe", "-c", "4096")
    said = [ln for ln in run(*args, "--explain", *server).stdout.splitlines() if "graph splits:" in ln]
    assert len(said) == 1 and said[0].endswith(
        " ms (a graph split: where a token's pass hands over from one device to the next; each costs a "
        "copy of the activations across and a latency)"), said
    plain = [ln for ln in run(*args, *server).stdout.splitlines() if "graph splits:" in ln]
    assert len(plain) == 1 and plain[0].endswith(" ms"), plain


@pytest.mark.parametrize("command", ["plan", "fit"])
def test_a_cpu_declared_larger_than_this_ram_says_its_speed_is_this_machines(command: str) -> None:
    """`--device CPU=4096GiB` (another machine) kept this machine's RAM probe as that machine's RAM
    speed: the assumption line named the probe, and a newcomer planning a server from a laptop read the
    laptop's speed as the server's. A note says so and how to give the other's; with ram= (or a size
    this machine has: RAM kept free here) there is none."""
    def notes(cpu: str) -> list[str]:
        r = run(command, QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", cpu,
                "--", "-ngl", "999", "--cpu-moe", "-c", "4096")
        assert r.returncode in (0, 3), r.stderr
        return [ln for ln in r.stdout.splitlines() if "RAM speed" in ln]

    said = notes("CPU=4096GiB")
    assert len(said) == 1 and said[0].startswith("note: --device CPU=4096GiB is more RAM than this "
                                                 "machine's "), said
    assert said[0].endswith(" GiB, but the speed estimate still takes this machine's RAM speed (its probe, "
                            "in the assumptions); for another machine give its speed too: --device "
                            "CPU=4096GiB,ram=8xDDR5-4800 (channels x MT/s) or bw=300GB/s"), said
    assert notes("CPU=4096GiB,ram=8xDDR5-4800") == []
    assert notes("CPU=4096GiB,bw=300GB/s") == []
    assert notes("CPU=1GiB") == []


def test_plan_help_says_explain_tells_what_a_graph_split_is() -> None:
    r = run("plan", "--help")
    assert r.returncode == 0, r.stderr
    assert "say what the speed block's graph splits are" in " ".join(r.stdout.split()), r.stdout
