"""Where the real llama.cpp runs a GPU layer's attention with -nkvo, against the speed estimate's rule
(``Dialect.nkvo_attention_on_gpu``): llama-bench on a loopback ggml-rpc-server (the offload
device), its scheduler's assignments printed by ``GGML_SCHED_DEBUG=2``.

With flash attention the FLASH_ATTN op runs on the offload device and the host cache's K/V views
are that split's inputs (copied to it); without, the KQ/softmax/KQV ops run on the CPU with Q, K and
V copied down.  Two splits a layer either way.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.procs import run_to_completion
from tests.support.rpc import rpc_servers

from offload_planner.core.dialects.base import Dialect


@pytest.fixture(scope="module")
def rpc(llama_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with rpc_servers(llama_bin_dir, 1, tmp_path_factory.mktemp("rpc")) as endpoints:
        yield endpoints[0]


@pytest.mark.parametrize("fa", [True, False])
def test_nkvo_attention_runs_where_the_estimate_says(fa: bool, llama_bin_dir: Path, rpc: str,
                                                     small_models: dict[str, Path], tmp_path: Path) -> None:
    cmd = [str(llama_bin_dir / "llama-bench"), "-v", "-m", str(small_models["llama"]), "--rpc", rpc,
           "-ngl", "99", "-nkvo", "1", "-fa", "1" if fa else "0", "-p", "0", "-n", "2", "-r", "1", "-t", "1"]
    code, out = run_to_completion(cmd, log_path=tmp_path / "bench.log", timeout=180,
                                  env={**os.environ, "GGML_SCHED_DEBUG": "2"})
    assert code == 0, out[-2000:]
    ops = re.findall(r"node #\s*\d+ \(\s*(FLASH_ATTN|SOFT_MAX)\):\s+\S+ \(\s*\d+K\) \[\s*(\S+?)[\s\]]", out)
    assert ops, out[-3000:]
    on_gpu = {dev.startswith("RPC") for _, dev in ops}
    assert on_gpu == {Dialect("llama.cpp").nkvo_attention_on_gpu(fa)}, ops
    if fa:  # the cache's views cross to the device as split inputs
        assert re.search(r"SPLIT #\d+: RPC0\S* # \d+ inputs: \[cache_k_l0 \(view\)", out), out[-3000:]
    else:  # Q goes down with the new K and V rows
        assert re.search(r"SPLIT #\d+: CPU # \d+ inputs: .*\[Qcur-0", out), out[-3000:]
