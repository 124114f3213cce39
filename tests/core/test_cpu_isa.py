"""The host CPU's instruction set read from real ``/proc/cpuinfo`` / ``sysctl`` texts, and what it
changes in the estimate: the per-core compute (prompt processing on the CPU) by the tier's public
figure, said so in the assumptions; not the i-quants' AVX2-only kernels, not token generation (bound
by the bytes read), not a declared ``tflops=``."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q
from tests.support.quant_mixes import uniform_mix

from offload_planner.backend import speed_store
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.dialects import Dialect
from offload_planner.core.errors import PlannerError
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.cpu_isa import GAINS, CpuInfo, Isa, parse_proc_cpuinfo, parse_sysctl
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import (
    DEFAULT_CPU_TFLOPS_PER_THREAD,
    Source,
    hardware_for,
    host_speed,
)
from offload_planner.core.speed.result import SpeedEstimate
from offload_planner.core.synth import BIG_MODELS, write_model

# An AVX2 desktop (Comet Lake: no AVX-512), as /proc/cpuinfo prints its first processor
COMET_LAKE = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 165
model name\t: Intel(R) Core(TM) i7-10700 CPU @ 2.90GHz
stepping\t: 5
cpu MHz\t\t: 4693.041
cache size\t: 16384 KB
siblings\t: 16
core id\t\t: 0
cpu cores\t: 8
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi mmx \
fxsr sse sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc art arch_perfmon pebs bts rep_good nopl \
xtopology nonstop_tsc cpuid aperfmperf pni pclmulqdq dtes64 monitor ds_cpl vmx est tm2 ssse3 sdbg fma cx16 \
xtpr pdcm pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand lahf_lm abm \
3dnowprefetch cpuid_fault epb invpcid_single ssbd ibrs ibpb stibp ibrs_enhanced tpr_shadow vnmi flexpriority \
ept vpid ept_ad fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid mpx rdseed adx smap clflushopt intel_pt \
xsaveopt xsavec xgetbv1 xsaves dtherm ida arat pln pts hwp hwp_notify hwp_act_window hwp_epp pku ospke \
md_clear flush_l1d arch_capabilities
bugs\t\t: spectre_v1 spectre_v2 spec_store_bypass swapgs itlb_multihit mmio_stale_data retbleed eibrs_pbrsb
bogomips\t: 5799.77

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Core(TM) i7-10700 CPU @ 2.90GHz
flags\t\t: fpu avx2 avx512f avx512bw avx512_vnni
"""

# A 2-vCPU cloud EPYC (Zen 4) under KVM: AVX-512 with VNNI and BF16, no clock in its name
EPYC_ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
microcode\t: 0x1000065
cpu MHz\t\t: 2596.142
cache size\t: 1024 KB
physical id\t: 0
siblings\t: 2
core id\t\t: 0
cpu cores\t: 2
fpu\t\t: yes
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse \
sse2 ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid extd_apicid \
tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes \
xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw \
topoext vmmcall fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq rdseed adx smap \
avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx512_bf16 \
clzero xsaveerptr arat avx512vbmi umip avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg \
avx512_vpopcntdq rdpid fsrm
bogomips\t: 5192.28
"""

# Sapphire Rapids (the flags of a GCP c3 instance, ollama issue 2205): AMX tiles for int8 and bf16
SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse \
sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid \
tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c \
rdrand hypervisor lahf_lm abm 3dnowprefetch invpcid_single ssbd ibrs ibpb stibp ibrs_enhanced fsgsbase \
tsc_adjust bmi1 avx2 smep bmi2 erms invpcid rtm avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb \
avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 arat avx512vbmi umip \
avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq la57 rdpid cldemote movdiri \
movdir64b fsrm md_clear serialize amx_bf16 avx512_fp16 amx_tile amx_int8 arch_capabilities
"""

# Skylake-SP: AVX-512 without VNNI
SKYLAKE_SP = """processor\t: 0
model name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi1 bmi2 avx512f avx512dq avx512cd avx512bw \
avx512vl
"""

# An ARM server (Graviton 3): no model name, Features instead of flags
GRAVITON = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma \
lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm \
svebf16 i8mm bf16 dgh rng
CPU implementer\t: 0x41
CPU architecture: 8
"""

INTEL_MAC = """machdep.cpu.brand_string: Intel(R) Core(TM) i9-9880H CPU @ 2.30GHz
machdep.cpu.features: FPU VME DE PSE TSC MSR PAE MCE CX8 APIC SEP MTRR PGE MCA CMOV PAT PSE36 CLFSH DS ACPI \
MMX FXSR SSE SSE2 SS HTT TM PBE SSE3 PCLMULQDQ DTES64 MON DSCPL VMX EST TM2 SSSE3 FMA CX16 TPR PDCM SSE4.1 \
SSE4.2 x2APIC MOVBE POPCNT AES PCID XSAVE OSXSAVE SEGLIM64 TSCTMR AVX1.0 RDRAND F16C
machdep.cpu.leaf7_features: RDWRFSGS TSC_THREAD_OFFSET SGX BMI1 HLE AVX2 SMEP BMI2 ERMS INVPCID RTM FPU_CSDS \
MPX RDSEED ADX SMAP CLFSOPT IPT MDCLEAR TSXFA IBRS STIBP L1DF SSBD
machdep.cpu.core_count: 8
"""

APPLE_SILICON = """machdep.cpu.cores_per_package: 10
machdep.cpu.core_count: 10
machdep.cpu.logical_per_package: 10
machdep.cpu.thread_count: 10
machdep.cpu.brand_string: Apple M1 Pro
"""


@pytest.mark.parametrize(("text", "model", "isa", "ghz"), [
    (COMET_LAKE, "Intel(R) Core(TM) i7-10700 CPU @ 2.90GHz", Isa.AVX2, 2.9),
    (EPYC_ZEN4, "AMD EPYC", Isa.AVX512_VNNI, None),
    (SAPPHIRE_RAPIDS, "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", Isa.AMX, 2.7),
    (SKYLAKE_SP, "Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz", Isa.AVX512, 2.4),
    (GRAVITON, "", None, None),
])
def test_proc_cpuinfo_first_processor(text: str, model: str, isa: Isa | None, ghz: float | None) -> None:
    got = parse_proc_cpuinfo(text)
    assert (got.model, got.isa, got.ghz, got.source) == (model, isa, ghz, "/proc/cpuinfo")


def test_read_cpuinfo_keeps_the_first_processor(tmp_path: Path) -> None:
    """The second processor of COMET_LAKE claims AVX-512: only the first block counts."""
    f = tmp_path / "cpuinfo"
    f.write_text(COMET_LAKE, encoding="utf-8")
    assert parse_proc_cpuinfo(speed_store.read_cpuinfo(f)).isa is Isa.AVX2
    assert speed_store.read_cpuinfo(tmp_path / "missing") == ""


def test_read_cpuinfo_reads_line_ends_as_a_text_file_does(tmp_path: Path) -> None:
    """Read as bytes (no text stream: a one-shot plan's cost), the block is what a text file gave:
    a byte-order mark dropped, \\r\\n and \\r line ends as \\n (the blank line after the first processor
    found), an undecodable byte replaced."""
    f = tmp_path / "cpuinfo"
    f.write_bytes(b"\xef\xbb\xbf" + COMET_LAKE.replace("\n", "\r\n").encode() + b"\xff")
    assert speed_store.read_cpuinfo(f) == COMET_LAKE.split("\n\n", 1)[0]
    f.write_bytes(b"model name\t: A\rflags\t: avx2 fma\r\rprocessor\t: 1\xff\n")
    with open(f, encoding="utf-8-sig", errors="replace") as text:
        as_text = text.read().split("\n\n", 1)[0]
    assert speed_store.read_cpuinfo(f) == as_text == "model name\t: A\nflags\t: avx2 fma"
    for ends in ("\n\r\n", "\r\n\r", "\r\r\n", "\r\n\n"):  # every pair of line ends is a blank line
        f.write_bytes(("model name\t: A" + ends + "processor\t: 1\n").encode())
        assert speed_store.read_cpuinfo(f) == "model name\t: A", ends


def test_read_cpuinfo_reads_up_to_the_first_blank_line(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine of many processors lists them all (about 1.5 KiB each, made by the kernel as it is
    read): only the first is wanted, and the read stops at the page holding the blank line after it
    instead of reading 64 KiB of them."""
    f = tmp_path / "cpuinfo"
    other = "processor\t: 9\nflags\t: " + "avx512f " * 180 + "\n\n"
    f.write_text(COMET_LAKE.split("\n\n", 1)[0] + "\n\n" + other * 40, encoding="utf-8")
    assert f.stat().st_size > 1 << 15
    got: list[int] = []
    real = speed_store.os.read

    def counted(fd: int, n: int) -> bytes:
        data = real(fd, n)
        got.append(len(data))
        return data

    monkeypatch.setattr(speed_store.os, "read", counted)
    assert parse_proc_cpuinfo(speed_store.read_cpuinfo(f)).isa is Isa.AVX2
    assert 0 < sum(got) <= 4096, got


@pytest.mark.parametrize(("text", "isa", "ghz"), [(INTEL_MAC, Isa.AVX2, 2.3), (APPLE_SILICON, None, None)])
def test_sysctl(text: str, isa: Isa | None, ghz: float | None) -> None:
    got = parse_sysctl(text)
    assert (got.isa, got.ghz, got.source) == (isa, ghz, "sysctl")


def test_this_machine_is_read() -> None:
    """On Linux the planner reads this machine's /proc/cpuinfo (whatever tier it is)."""
    import sys

    speed_store.this_cpu.cache_clear()
    got = speed_store.this_cpu()
    if sys.platform.startswith("linux"):
        assert got.source == "/proc/cpuinfo"
        assert got == parse_proc_cpuinfo(Path("/proc/cpuinfo").read_text(encoding="utf-8"))


def _host(decl: str, cpu: CpuInfo | None, threads: int = 2) -> tuple[float, str, Source, float]:
    d = host_speed(parse_device_decl(decl), threads=threads, cpu=cpu)
    return d.tflops.value, d.tflops.note, d.tflops.source, d.isa_gain


def test_compute_by_instruction_set_and_said_so() -> None:
    vnni = GAINS[Isa.AVX512_VNNI].value
    assert vnni > GAINS[Isa.AVX512].value > GAINS[Isa.AVX2].value == 1.0
    base = _host("CPU=64GiB", None)
    assert base == (round(2 * DEFAULT_CPU_TFLOPS_PER_THREAD, 3), "2 threads x 0.1 TFLOPS", Source.DEFAULT,
                    1.0)
    tf, note, src, gain = _host("CPU=64GiB", parse_proc_cpuinfo(EPYC_ZEN4))
    assert (tf, src, gain) == (pytest.approx(2 * DEFAULT_CPU_TFLOPS_PER_THREAD * vnni, abs=1e-3),
                               Source.DEFAULT, vnni)
    assert "avx512_vnni (AMD EPYC per /proc/cpuinfo): 1.95 x the AVX2 figure" in note
    assert "ik_llama.cpp PR 533" in note  # the public measurement it comes from
    # an AVX2 desktop keeps the figure, at the clock its name states
    tf, note, _, gain = _host("CPU=64GiB", parse_proc_cpuinfo(COMET_LAKE))
    assert (tf, gain) == (pytest.approx(2 * 0.1 * 2.9 / 3.125, abs=1e-3), 1.0)
    assert "2.9 GHz in its model name" in note and "avx2" in note
    # not known: the AVX2 figure, said so
    _, note, _, gain = _host("CPU=64GiB", CpuInfo("", None, None, "not read on Windows"))
    assert gain == 1.0 and "not read on Windows: the AVX2 figure" in note


def test_declared_figures_win() -> None:
    zen4 = parse_proc_cpuinfo(EPYC_ZEN4)
    assert _host("CPU=64GiB,tflops=3", zen4) == (3.0, "CPU tflops=", Source.DECLARED, 1.0)
    tf, note, _, gain = _host("CPU=64GiB,isa=avx2", zen4)  # isa= declared over /proc/cpuinfo
    assert (tf, gain) == (0.2, 1.0) and "(isa=)" in note
    tf, _, src, gain = _host("CPU=64GiB,isa=amx,ghz=2", None)
    assert (tf, src, gain) == (pytest.approx(2 * 0.1 * GAINS[Isa.AMX].value * 2 / 3.125, abs=1e-3),
                               Source.DECLARED, GAINS[Isa.AMX].value)


def test_isa_key_refused_where_it_means_nothing() -> None:
    with pytest.raises(PlannerError, match=r"unknown instruction set 'sse4'.*avx512_vnni"):
        parse_device_decl("CPU=64GiB,isa=sse4")
    with pytest.raises(PlannerError, match="isa= describes the host's CPU"):
        parse_device_decl("CUDA0=24GiB,isa=avx2")



@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Model]:
    out = {}
    root = tmp_path_factory.mktemp("isa")
    base = BIG_MODELS["Qwen3-30B-A3B-Q4_K_M"]
    for t in (Q.Q4_K, Q.IQ3_S):
        spec = base.__class__(**{**base.__dict__, "name": f"qwen-{t.name}", "quant": uniform_mix(t, 15)})
        [path] = write_model(spec, root / f"{t.name}.gguf", header_only=True)
        out[t.name] = open_model(str(path))
    dense = BIG_MODELS["Llama-3.1-70B-Q4_K_M"]  # 8 of its layers: a dense model's matrices
    spec = dense.__class__(**{**dense.__dict__, "name": "llama-Q4_K", "n_layer": 8,
                              "quant": uniform_mix(Q.Q4_K, 15)})
    [path] = write_model(spec, root / "dense-Q4_K.gguf", header_only=True)
    out["dense-Q4_K"] = open_model(str(path))
    return out


def _cpu_only(model: Model, cpu: CpuInfo | None, dialect: str = "llama.cpp-2025",
              extra: tuple[str, ...] = ()) -> SpeedEstimate:
    """A CPU-only estimate; by default with the 2025 builds' kernels (before the pinned build's tiled
    matmul: test_cpu_tiled.py)."""
    ds = DeviceSet(parse_device_decl("CPU=512GiB,bw=60GB/s,cores=16"), ())
    d = Dialect(dialect)
    plan = plan_from_args(model, ds, parse_server_args(["-c", "4096", "-t", "16", *extra], dialect=d), d)
    return estimate(plan, hardware_for(ds, threads=16, cpu=cpu), prompt=512)


def test_estimate_moves_as_the_instruction_set_says(models: dict[str, Model]) -> None:
    """(The 2025 builds' CPU kernels, before the pinned build's tiled matmul.) Q4_K prompt processing on
    the CPU: a dense model's faster on an AVX-512 VNNI CPU (its repacked
    GEMM; compute-bound, the reads of each micro-batch added), a MoE model's less so (its routed
    experts go through mul_mat_id's AVX2 GEMV per token: efficiency.cpu_pp_cost), token generation
    the same (bytes over bandwidth); the lattice i-quants, whose vec_dot is AVX2 code on every x86
    CPU, as before in both (but their attention)."""
    zen4 = parse_proc_cpuinfo(EPYC_ZEN4)
    avx2 = parse_proc_cpuinfo(COMET_LAKE.replace(" @ 2.90GHz", ""))
    dense_avx2, dense_zen4 = _cpu_only(models["dense-Q4_K"], avx2), _cpu_only(models["dense-Q4_K"], zen4)
    assert 1.6 < dense_zen4.pp_tps / dense_avx2.pp_tps <= GAINS[Isa.AVX512_VNNI].value
    q4k_avx2, q4k_zen4 = _cpu_only(models["Q4_K"], avx2), _cpu_only(models["Q4_K"], zen4)
    assert q4k_avx2.pp_tps == pytest.approx(_cpu_only(models["Q4_K"], None).pp_tps)
    assert 1.0 < q4k_zen4.pp_tps / q4k_avx2.pp_tps < 0.9 * dense_zen4.pp_tps / dense_avx2.pp_tps
    assert q4k_zen4.tg_tps == pytest.approx(q4k_avx2.tg_tps)
    iq_avx2, iq_zen4 = _cpu_only(models["IQ3_S"], avx2), _cpu_only(models["IQ3_S"], zen4)
    # (the attention's FLOPs still take the faster compute: a few per cent at a 512-token prompt)
    assert iq_zen4.pp_tps == pytest.approx(iq_avx2.pp_tps, rel=0.02)
    assert iq_zen4.tg_tps == pytest.approx(iq_avx2.tg_tps, rel=1e-3)
    said = [a.text() for a in q4k_zen4.assumptions if a.what == "CPU compute"]
    assert len(said) == 1 and "avx512_vnni" in said[0] and "(default:" in said[0]
