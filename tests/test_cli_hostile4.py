"""Hostile input left by hostile3: an rpc-server that never answers (the estimate said 'loopback
assumed' with no word of the failed probe), ``margin=0B`` (read as the default 1 GiB), a plan file's
hand-edited ``extra_args`` (added to the command unchecked), a CPU model name with control characters
or a BOM. One clear line naming the endpoint, flag, file or key; never a traceback or a hang."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tests.support.cli import run_cli
from tests.support.refusals import refused

from offload_planner.backend import speed_store
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.json_at import At
from offload_planner.core.plan import plan_from_args
from offload_planner.core.plan_file import PlanFile, _device_json, _devices, load_plan, plan_json
from offload_planner.core.speed.candidate import margin_of
from offload_planner.core.speed.cpu_isa import Isa, parse_proc_cpuinfo
from offload_planner.core.speed.hardware import host_speed
from offload_planner.core.synth import SMALL_MODELS, write_model

QWEN = str(Path(__file__).resolve().parents[1] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")


def run(*args: str, timeout: float = 60, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``config``: the config folder the child uses."""
    env = {} if config is None else {"OFFLOAD_PLANNER_CONFIG_DIR": str(config)}
    return run_cli(*args, timeout=timeout, **env)


def test_a_failed_rpc_probe_is_said_with_its_endpoint_and_reason(tmp_path: Path) -> None:
    """An rpc-server that accepts and never answers: the probe gave up silently and the estimate said
    'network link not declared; loopback assumed' as if nothing had been tried. Now the assumption
    names RPC0, HOST:PORT and the reason; the probe waits one socket timeout (2 s), not the deadline."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)  # the kernel accepts the connection; nobody ever reads or answers
    endpoint = f"127.0.0.1:{srv.getsockname()[1]}"
    try:
        r = run("plan", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", "RPC0=24GiB",
                "--device", "CPU=64GiB,bw=50GB/s", "--", "--rpc", endpoint, "-c", "4096", config=tmp_path)
    finally:
        srv.close()
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(x for x in r.stdout.splitlines() if "RPC0 host link" in x)
    assert f"RPC0 {endpoint}: no answer within 2 s; link assumed 10 GB/s loopback" in line, line
    assert "not declared" not in line


def _fit(*device: str) -> dict[str, Any]:
    r = run("fit", QWEN, "--no-detect", *device, "--device", "CPU=64GiB,bw=50GB/s", "--json",
            "--", "-c", "4096")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def test_margin_0b_is_no_margin_and_the_default_stays_1_gib() -> None:
    """``--device CUDA0=18GiB,margin=0B`` was read as 'margin not set' (Device.margin == 0) and fit kept
    the default 1 GiB free: the same command as with no margin= at all. Now 0B keeps nothing free (the
    fit puts more experts on the card); without margin= the default stays 1 GiB (= margin=1GiB)."""
    unset, zero, one = (_fit("--device", f"CUDA0=18GiB{m}") for m in ("", ",margin=0B", ",margin=1GiB"))
    assert unset["plan"]["command"] == one["plan"]["command"]
    assert zero["plan"]["command"] != unset["plan"]["command"]

    def cuda0(out: dict[str, Any]) -> int:
        return int(next(d for d in out["plan"]["devices"] if d["name"] == "CUDA0")["total_bytes"])

    assert 17 << 30 < cuda0(zero) <= 18 << 30, cuda0(zero)
    assert cuda0(unset) <= 17 << 30, cuda0(unset)


def test_margin_0b_survives_a_plan_file() -> None:
    """A plan file keeps a margin given as 0B (written only then: other files stay as they were)."""
    given = Device("CUDA0", DeviceKind.CUDA, 8 << 30, margin_given=True)
    plain = Device("CUDA1", DeviceKind.CUDA, 8 << 30)
    assert not plain.margin_given and Device("CUDA2", DeviceKind.CUDA, 8 << 30, margin=1).margin_given
    entries = [_device_json(d) for d in (given, plain, replace(plain, name="CUDA3", margin=1 << 30))]
    assert [e.get("margin_given") for e in entries] == [True, None, None]
    cpu = _device_json(Device("CPU", DeviceKind.CPU, 64 << 30))
    loaded = _devices(At(json.loads(json.dumps({"cpu": cpu, "gpus": entries})), "$.devices"))
    assert [d.margin_given for d in loaded.gpus] == [True, False, True]
    assert [margin_of(d) for d in loaded.gpus] == [0, 1 << 30, 1 << 30]


def _plan_file(tmp_path: Path, extra: list[str]) -> Path:
    model = write_model(SMALL_MODELS["qwen3moe"], tmp_path / "qwen3moe.gguf")[0]
    gpus = (Device("CUDA0", DeviceKind.CUDA, 8 << 30), Device("CUDA1", DeviceKind.CUDA, 8 << 30))
    plan = plan_from_args(open_model(model), DeviceSet(Device("CPU", DeviceKind.CPU, 64 << 30), gpus),
                          argparse.Namespace(ctx_size=2048))
    data = plan_json(PlanFile.of(plan))
    data["extra_args"] = extra
    path = tmp_path / "edited.plan.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("extra", "index", "named"), [
    (["-t", "4", "-ts", "nan,1"], 2, "a NaN or infinite proportion"),
    (["--jinja", "--frobnicate"], 1, "invalid argument: --frobnicate"),
    (["-t", "abc"], 0, "expected an integer"),
    (["-ot", "exps=CUDA7"], 0, "unknown buffer type"),
    (["-t", "4", "-c", "99999"], 2, "-c is set by the plan itself"),
    (["llama-server", "-t", "4"], 0, "'llama-server' is not a flag"),
])
def test_a_plan_files_extra_args_are_checked_as_plan_checks_a_command(
        tmp_path: Path, extra: list[str], index: int, named: str) -> None:
    """A hand-edited plan file's extra_args went into the command unchecked: '-ts nan,1' (which
    llama.cpp cannot load with) or an unknown flag, while the estimate assumed the plan's own split.
    Now loading the file refuses it naming the file and the JSON path of the entry."""
    path = _plan_file(tmp_path, extra)
    refused(run("launch", str(path), "--no-detect"), 2, str(path), f"$.extra_args[{index}]", named)


def test_a_plan_files_usual_extra_args_still_load(tmp_path: Path) -> None:
    extra = ["-t", "4", "--jinja", "--host", "127.0.0.1", "--port", "8081", "--temp", "0.7"]
    assert load_plan(_plan_file(tmp_path, extra)).extra_args == extra


HOSTILE_CPUINFO = ("\ufeffprocessor\t: 0\n"
                   "\ufeffmodel name\t: Intel(R) Xeon(R) \x1b[2J\x1b[31mGold\x07 6148 CPU @ 2.40GHz\x00\n"
                   "\ufeffflags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw\n\nprocessor\t: 1\n")


def test_cpuinfo_control_characters_are_escaped_and_a_bom_does_not_hide_a_key(tmp_path: Path) -> None:
    """A model name with an escape sequence (clear the screen, red) and a bell was printed raw in the
    estimate's assumptions; a byte-order mark before 'model name' or 'flags' hid the key (the CPU read
    as having no model name and no AVX2). Now the characters are escaped and the keys read."""
    f = tmp_path / "cpuinfo"
    f.write_text(HOSTILE_CPUINFO, encoding="utf-8")
    for cpu in (parse_proc_cpuinfo(HOSTILE_CPUINFO),
                parse_proc_cpuinfo(speed_store.read_cpuinfo(f))):
        assert cpu.model == r"Intel(R) Xeon(R) \x1b[2J\x1b[31mGold\x07 6148 CPU @ 2.40GHz\x00", cpu.model
        assert (cpu.isa, cpu.ghz) == (Isa.AVX512, 2.4)
        note = host_speed(parse_device_decl("CPU=64GiB"), threads=2, cpu=cpu).tflops.note
        assert r"Xeon(R) \x1b[2J" in note and all(ch.isprintable() for ch in note), note
    long = parse_proc_cpuinfo("model name : " + "A" * 100_000 + "\n")
    assert len(long.model) < 300
