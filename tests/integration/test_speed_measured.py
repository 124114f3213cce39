"""Measured speed against the real llama-server (issue 11, part 4).

* A model filled by ``random_fill`` is well-formed: gguf-py dequantizes every tensor to finite
  values of a trained model's magnitude, no block is left zero, and llama-server loads it and
  generates.
* ``server_bench.measure`` reads the server's own timings: it asks for N prompt tokens and M
  generated ones and the server reports exactly those counts with positive rates.
* ``offload-planner launch --bench`` as a user runs it: prints measured against estimated tg and
  pp, stores the efficiencies in the (temporary) config folder, and a later ``plan`` of the same
  backend says its estimate is calibrated and uses the stored figures.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize
from tests.support.procs import free_port, running_process

from offload_planner.backend.server_bench import measure
from offload_planner.core.speed.calibrate import LABELS
from offload_planner.core.synth import SMALL_MODELS, write_model
from offload_planner.core.synth.random_fill import fill_random

pytestmark = pytest.mark.integration

GUI = Path(__file__).resolve().parents[2] / "gui"


@pytest.fixture(scope="module")
def random_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rand") / "llama-random.gguf"
    write_model(SMALL_MODELS["llama"], path)
    fill_random([path], seed=3)
    return path


def test_random_fill_is_well_formed(random_llama: Path) -> None:
    reader = GGUFReader(random_llama)
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type)
        assert np.isfinite(values).all(), t.name
        assert np.abs(values).max() < 1.0, t.name  # the magnitude of trained weights, not 1e4
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        assert raw.any(), f"{t.name} was left zero"
        assert np.unique(values).size > 10, t.name


def _cli(*args: str, cfg: Path) -> tuple[int, str, str]:
    import subprocess

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cfg),
           "PYTHONPATH": str(GUI), "OFFLOAD_PLANNER_CONFIG_DIR": str(cfg), "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run([sys.executable, "-m", "offload_planner", *args], capture_output=True, text=True,
                       timeout=600, env=env)
    return r.returncode, r.stdout, r.stderr


def test_measure_reads_the_servers_timings(random_llama: Path, llama_server: Path, tmp_path: Path) -> None:
    port = free_port()
    argv = [str(llama_server), "-m", str(random_llama), "--host", "127.0.0.1", "--port", str(port),
            "-c", "512", "-ngl", "0", "-t", "1", "-np", "1", "-fit", "off"]
    with running_process(argv, log_path=tmp_path / "srv.log", ready=r"listening on http://", timeout=120):
        got = measure(f"http://127.0.0.1:{port}", n_vocab=SMALL_MODELS["llama"].tokenizer.n_vocab,
                      prompt_tokens=48, gen_tokens=12)
    assert got.prompt_tokens == 48
    assert got.gen_tokens == 12
    assert got.pp_tps > 0 and got.tg_tps > 0
    assert got.prompt_ms == pytest.approx(1000 * 48 / got.pp_tps, rel=1e-3)
    # the pinned server counts decode steps: the first generated token comes from the prompt's logits
    assert got.gen_ms == pytest.approx(1000 * 11 / got.tg_tps, rel=1e-3)


def test_launch_bench_calibrates_later_estimates(random_llama: Path, llama_server: Path,
                                                 tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    server_args = ["-c", "512", "-ngl", "0", "-t", "1", "-fit", "off"]
    before = _cli("plan", str(random_llama), "--no-detect", "--json", "--", *server_args, cfg=cfg)
    assert before[0] == 0, before[2]
    speed_before = json.loads(before[1])["speed"]
    assert speed_before["calibrated"] is False

    code, out, err = _cli("launch", str(random_llama), "--server", str(llama_server), "--bench",
                          "--bench-prompt", "64", "--bench-gen", "8", "--quiet", "--", *server_args, cfg=cfg)
    assert code == 0, err[-2000:]
    assert "pp " in out and "measured" in out and "estimated" in out, out
    stored = json.loads((cfg / "speed.json").read_text())
    (machine,) = stored["machines"].values()
    effs = machine["efficiencies"]["llama.cpp"]
    assert effs, stored
    assert all(v > 0 for v in effs.values())

    after = _cli("plan", str(random_llama), "--no-detect", "--json", "--", *server_args, cfg=cfg)
    speed_after = json.loads(after[1])["speed"]
    assert speed_after["calibrated"] is True
    calibrated = {a["what"]: a for a in speed_after["assumptions"] if a["source"] == "calibrated"}
    assert calibrated, speed_after["assumptions"]
    assert speed_after["tg_tps"] != speed_before["tg_tps"] or speed_after["pp_tps"] != speed_before["pp_tps"]


def test_speed_check_with_mtp_calibrates_pp_only(llama_server: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The real llama-server with ``--spec-type draft-mtp`` on the GLM-4.5-style model: the check shows
    tg with MTP beside the measurement, and calibrates nothing from tg (its rate depends on the drafted
    tokens this answer accepted, which the estimate only assumes)."""
    from offload_planner.backend.speed_check import run_speed_check
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.devices import Device, DeviceKind, DeviceSet
    from offload_planner.core.gguf_reader import open_model
    from offload_planner.core.plan import plan_from_args

    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path / "cfg"))
    path = tmp_path / "glm4moe-random.gguf"
    write_model(SMALL_MODELS["glm4moe"], path)
    fill_random([path], seed=5)
    args = ["-c", "512", "-ngl", "0", "-t", "1", "-np", "1", "-fit", "off", "--spec-type", "draft-mtp"]
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 << 30, 64 << 30, hardware=(("bw", "20"),)), ())
    parsed = parse_server_args(args)
    plan = plan_from_args(open_model(path), devices, parsed)
    port = free_port()
    argv = [str(llama_server), "-m", str(path), "--host", "127.0.0.1", "--port", str(port), *args]
    with running_process(argv, log_path=tmp_path / "srv.log", ready=r"listening on http://", timeout=120):
        check = run_speed_check(f"http://127.0.0.1:{port}", plan, parsed, prompt_tokens=32, gen_tokens=8)
    assert check.estimated.spec is not None and check.estimated.spec.kind == "MTP (1 NextN layer)"
    assert check.measured.tg_tps > 0
    assert not any("bandwidth" in k for k in check.calibration.values), check.calibration.values
    assert any("tg not calibrated" in n for n in check.notes)


def test_launch_bench_no_store_says_so_and_gives_units(random_llama: Path, llama_server: Path,
                                                       tmp_path: Path) -> None:
    """`launch --bench --no-store` printed "calibration: tg (bottleneck CPU): cpu_thread_bandwidth
    10 -> 6.75": no unit, and nothing said it was not kept, which read as done.  Each change names its
    efficiency in words, as plan's assumptions do (not the field's name), and its unit, and a line says
    it was not stored; the config folder holds no efficiencies."""
    import re

    cfg = tmp_path / "cfg"
    code, out, err = _cli("launch", str(random_llama), "--server", str(llama_server), "--bench", "--no-store",
                          "--bench-prompt", "64", "--bench-gen", "8", "--quiet", "--",
                          "-c", "512", "-ngl", "0", "-t", "1", "-fit", "off", cfg=cfg)
    assert code == 0, err[-2000:]
    changes = re.findall(r"^  calibration: [^:]*: (.+?) \S+ -> \S+(.*)$", out, re.M)
    assert changes, out
    assert all(unit.strip() in ("x peak", "GB/s per thread") for _, unit in changes), changes
    # each efficiency in words (it printed the field's name, cpu_thread_bandwidth), as plan's assumptions
    assert all(name in LABELS.values() for name, _ in changes), changes
    assert "  not stored (--no-store): later estimates keep their figures" in out.splitlines()
    assert "stored: later estimates" not in out.replace("not stored", "")
    stored = json.loads((cfg / "speed.json").read_text()) if (cfg / "speed.json").exists() else {}
    assert not any(m.get("efficiencies") for m in stored.get("machines", {}).values()), stored
