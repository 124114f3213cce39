"""``plan`` on mutants of the bundled demo model's header (DeepSeek-V3, 1,086 tensors), in-process, on a
fixed time budget: every mutant gives a plan (exit 0 or 3) or one error line naming the file (exit 2),
each within its deadline. Mutations land mostly where they matter: the header and hyperparameters, the
tensor table (a scalar key's type or value overwritten with edge values; bit flips; 4/8-byte counts
made huge; bytes inserted, deleted, duplicated; the file cut short).

A first run (hostile7, 11,000 mutants over plan, fit, a mutant as -md draft and with draft-mtp) found
nothing to fix; this keeps it that way. ``FUZZ_SEED`` / ``FUZZ_SECONDS_SCALE`` explore further."""

from __future__ import annotations

import contextlib
import io
import random
import struct
from pathlib import Path

import pytest
from tests.support.fuzz import run_budget

from offload_planner.cli import demo_model_path, main
from offload_planner.core.gguf_reader import open_model

HUGE = [0, 1, 7, 13, 255, 65535, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
ARGS = ["--no-detect", "--device", "CUDA0=24GiB", "--device", "CPU=512GiB,bw=300GB/s", "--",
        "-ngl", "999", "-ot", "exps=CPU", "-c", "4096"]


class Mutants:
    def __init__(self) -> None:
        self.base = demo_model_path().read_bytes()
        model = open_model(str(demo_model_path()))
        self.keys = [k.encode() for k in model.metadata if not k.startswith("tokenizer.ggml.")]
        table = self.base.find(b"token_embd.weight")
        self.regions = [(0, 4096), (table - 64, len(self.base) - 80)]

    def __call__(self, rng: random.Random) -> tuple[str, bytes]:
        b = bytearray(self.base)
        kind = rng.choice(["key", "key", "flip", "u64", "u32", "insert", "delete", "dup", "trunc"])
        lo, hi = rng.choice(self.regions)
        at = rng.randrange(lo, hi)
        if kind == "key":
            key = rng.choice(self.keys)
            at = self.base.find(key) + len(key)
            if rng.random() < 0.3:
                b[at:at + 4] = struct.pack("<I", rng.choice([*range(14), 99]))
            else:
                b[at + 4:at + 12] = struct.pack("<Q", rng.choice(HUGE))
            kind = f"key {key.decode()}"
        elif kind == "flip":
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(lo, hi)] ^= 1 << rng.randrange(8)
        elif kind == "u64":
            b[at:at + 8] = struct.pack("<Q", rng.choice(HUGE))
        elif kind == "u32":
            b[at:at + 4] = struct.pack("<I", rng.choice(HUGE) & 0xFFFFFFFF)
        elif kind == "insert":
            b[at:at] = rng.randbytes(rng.randint(1, 16))
        elif kind == "delete":
            del b[at:at + rng.randint(1, 16)]
        elif kind == "dup":
            b[at:at] = b[at:at + rng.randint(4, 64)]
        else:
            del b[rng.randrange(len(b)):]
        return kind, bytes(b)


@pytest.mark.slow
def test_plan_on_mutated_demo_headers(tmp_path: Path) -> None:
    path = tmp_path / "mutant.gguf"

    def check(mutant: tuple[str, bytes]) -> str:
        path.write_bytes(mutant[1])
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["plan", str(path), *ARGS])
        lines = [x for x in err.getvalue().splitlines() if x.strip()]
        if code == 2:
            assert len(lines) == 1 and str(path) in lines[0], err.getvalue()[-2000:]
            return "refused"
        assert code in (0, 3) and "Traceback" not in err.getvalue(), (code, err.getvalue()[-2000:])
        return f"planned (exit {code})"

    tally = run_budget("demo header mutants", Mutants(), check, seed=70, seconds=15, per_input=10)
    assert tally.tried >= 50 and tally.counts["refused"] and tally.counts["planned (exit 0)"]
