"""The speed figures of each device, each with where it came from.

A GPU's figures come from its ``--device`` declaration (``bw=936GB/s``, ``pcie=4x16``,
``tflops=71``), else from what the driver reports through NVML (memory bus width and maximum memory
clock, maximum PCIe link generation and width: :func:`nvml_bandwidth_gbs`, :func:`pcie_gbs`), else
from the catalogue card it names (``CUDA0=rtx3090``) or NVML's device name names, else defaults.
The host (CPU): ``bw=200GB/s`` or ``ram=12xDDR5-4800``
(channels x MT/s x 8 bytes) declared, else the RAM probe measured on this machine, else a default;
its threads from ``-t``; its compute per core from its instruction set (``isa=``, else this
machine's ``/proc/cpuinfo``: core.speed.cpu_isa) and clock (``ghz=``).  An RPC device: the remote
device's figures plus ``link=10Gb/s``, else the link measured against its running rpc-server
(:class:`MeasuredLink`: throughput and the round trip each graph split waits for); ``threads=`` on
an RPC device whose server computes on a CPU limits its bandwidth as ``-t`` limits the host's
(``ggml-rpc-server`` uses half the remote's cores).  An rpc-server on this machine computing with
ggml's CPU backend (backend.speed_store.cpu_backend_evidence) gets this machine's CPU figures
(:func:`local_cpu_rpc`).
Every figure says whether it is measured, declared, catalogue, calibrated or default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.speed.catalogue import Card, card
from offload_planner.core.speed.cpu_isa import GAINS, CpuInfo, Isa
from offload_planner.core.speed.declared import (
    PCIE_LANE_GBS,
    Declared,
    parse_hardware_keys,
)


class Source(StrEnum):
    MEASURED = "measured"
    DECLARED = "declared"
    CATALOGUE = "catalogue"
    CALIBRATED = "calibrated"
    DRIVER = "driver"  # reported by the GPU driver (NVML)
    DEFAULT = "default"


@dataclass(frozen=True)
class Figure:
    value: float
    unit: str
    source: Source
    note: str = ""  # the spec page, the probe, the declaration, why a default

    def describe(self) -> str:
        return f"{self.value:g} {self.unit} ({self.source}{': ' + self.note if self.note else ''})"


#: Defaults when nothing better is known (said so in every estimate's assumptions).
DEFAULT_GPU_BW = 500.0  # GB/s
DEFAULT_GPU_TFLOPS = 50.0
DEFAULT_PCIE = (4, 16)
DEFAULT_HOST_BW = 50.0  # GB/s: two channels of DDR4-3200 (2 x 3200 MT/s x 8 B = 51.2)
DEFAULT_CPU_TFLOPS_PER_THREAD = 0.1  # peak per core (AVX2 FMA: 2 units x 8 fp32 x 2 ops x ~3 GHz ≈ 0.1)
#: A core of another instruction-set tier computes ``cpu_isa.GAINS[tier]`` of it (AVX-512 with VNNI:
#: 1.95, from public llama-bench measurements; core.speed.cpu_isa), read from this machine's
#: ``/proc/cpuinfo`` or declared (``isa=``); unknown: the AVX2 figure, said so.
#: The clock ``DEFAULT_CPU_TFLOPS_PER_THREAD`` stands for (32 FLOPs a cycle): a CPU declared with
#: ``ghz=`` (its vendor base clock) computes ``ghz / DEFAULT_CPU_GHZ`` of it a core.  Many-core server
#: parts run at about half a desktop part's clock (AMD EPYC 9965 2.25 GHz, Intel Xeon 6980P 2.0 GHz,
#: Ryzen 9 7950X 4.5 GHz base), and a core's FMA throughput follows its clock.
DEFAULT_CPU_GHZ = 3.125
DEFAULT_THREADS = 8
DEFAULT_RPC_LINK = 10.0  # GB/s: a loopback connection (not measured)

#: Keys the GPU detection adds from NVML (``backend.system``): ``nvml_bus=384x9751`` (memory bus bits
#: x maximum memory clock in MHz), ``nvml_pcie=4x16`` (maximum link generation x width)
NVML_KEYS = ("nvml_bus", "nvml_pcie")


def nvml_bandwidth_gbs(bus_width_bits: int, mem_clock_mhz: float) -> float:
    """Peak memory bandwidth from NVML's ``nvmlDeviceGetMemoryBusWidth`` and ``nvmlDeviceGetMaxClockInfo
    (NVML_CLOCK_MEM)``: the clock NVML reports moves data on both edges (RTX 3090: 9751 MHz for its
    19.5 Gbps GDDR6X; CUDA's nvbench prints the RTX 4090 as "384-bit DDR @10501MHz", 1008 GB/s), so
    bytes per transfer x clock x 2."""
    return bus_width_bits / 8 * mem_clock_mhz * 2 / 1000


def pcie_gbs(generation: int, width: int) -> float:
    """One direction of a PCIe link, GB/s after line coding (:data:`PCIE_LANE_GBS` per lane)."""
    return PCIE_LANE_GBS[generation] * width


@dataclass(frozen=True)
class DeviceSpeed:
    """The figures of one device the estimate uses."""

    name: str
    kind: DeviceKind
    bandwidth: Figure  # GB/s, weights and KV read from its memory
    tflops: Figure  # dense throughput for prompt processing
    link: Figure  # GB/s to the host: PCIe, or the network for RPC; the memory itself when unified
    card: str = ""  # catalogue card name, if any
    threads: int | None = None  # CPU, and an RPC device computing on its server's CPU (threads=)
    unified: bool = False  # Apple: the GPU reads host memory directly
    latency_us: Figure | None = None  # RPC: the measured round trip of one graph split
    share: float = 1.0  # of a core each of its threads gets: cores / threads when oversubscribed
    #: CPU: its compute against an AVX2 core's (core.speed.cpu_isa.GAINS), 1 when not known or
    #: ``tflops=`` is declared; the kernels with no path beyond AVX2 do not get it (efficiency.cpu_cost)
    isa_gain: float = 1.0
    #: CPU: its instruction-set tier when known (declared ``isa=`` or read), None when not known, below
    #: AVX2 or ``tflops=`` is declared: which of llama.cpp's x86 kernel paths run (efficiency.cpu_pp_cost)
    isa: Isa | None = None
    #: GB/s one thread's copy reads on the machine its threads run on (the RAM probe's single-thread
    #: pass: this machine's CPU and the rpc-servers on it), None when not measured: its threads' share
    #: of the bandwidth (core.speed.rates.thread_bandwidth)
    thread_bandwidth: Figure | None = None
    #: the flag ``threads`` comes from: ``-t`` (one token), ``-tb`` (a batch: :attr:`Hardware.batch`)
    threads_flag: str = "-t"
    #: an RPC device whose server computes with ggml's CPU backend on this machine (:func:`local_cpu_rpc`):
    #: its kernels are the CPU's (core.speed.rates.computes_on_cpu)
    cpu_backend: bool = False


@dataclass(frozen=True)
class Threads:
    """The compute threads on the machine llama-server runs on, against its physical cores:
    llama-server's ``-t`` (default: the physical cores, ``common_cpu_get_num_math``) and the threads
    of every rpc-server on it (``-t``, default ``hardware_concurrency() / 2``: rpc-server.cpp).
    ``local``: the devices whose work runs on these cores (the CPU, RPC devices served from here);
    ``endpoints``: each local RPC device's endpoint (a key of ``rpc``).

    The devices of one token take turns: the scheduler runs the graph's splits one after another, each
    split's inputs being the previous one's outputs (pinned build ggml/src/ggml-backend.cpp:1812-1955:
    an input from another backend is copied after ``ggml_backend_synchronize`` of that backend, :1942,
    neither the CPU nor RPC backend having ``cpy_tensor_async``), and an idle thread does not hold its
    core long: llama-server's main thread waits for an RPC split on a future (ggml-rpc.cpp:527-533),
    an rpc-server's on its socket (ggml-rpc.cpp:2048-2055), and ggml's CPU workers (OpenMP in the
    pinned wheel, ggml-cpu.c:3419-3437, libgomp's GOMP_SPINCOUNT; the threadpool's own poll otherwise,
    :3208-3239) spin a short while and then sleep.  So each device's threads are weighed against the
    cores alone: llama-server's ``-t`` (``-tb``) for the CPU, an rpc-server's own ``-t`` for its device."""

    cores: int
    server: int
    server_given: bool
    rpc: Mapping[str, int] = field(default_factory=dict)  # endpoint -> threads
    local: tuple[str, ...] = ()
    flag: str = "-t"  # llama-server's flag ``server`` comes from: -t, or -tb for a batch (Hardware.batch)
    endpoints: Mapping[str, str] = field(default_factory=dict)  # local RPC device -> its endpoint

    @property
    def total(self) -> int:
        return self.server + sum(self.rpc.values())

    def threads_of(self, device: str) -> int:
        """The threads computing ``device``'s splits: llama-server's for the CPU (the first of
        ``local``), the rpc-server's for a local RPC device (0 when not known)."""
        if self.local and device == self.local[0]:
            return self.server
        return self.rpc.get(self.endpoints.get(device, ""), 0)

    def share_of(self, device: str) -> float:
        """Of a core each thread of ``device`` gets while it computes: ``cores / its threads``, 1 when
        they fit (the other devices' threads wait meanwhile)."""
        n = self.threads_of(device)
        return min(1.0, self.cores / n) if n else 1.0

    @property
    def crowded(self) -> tuple[str, ...]:
        """The local devices whose own threads outnumber the cores."""
        return tuple(d for d in self.local if self.threads_of(d) > self.cores)

    @property
    def oversubscribed(self) -> bool:
        return bool(self.crowded)

    @property
    def share(self) -> float:
        """Of a core each thread gets on the most crowded device (1 when every device's fit)."""
        return min((self.share_of(d) for d in self.local), default=1.0)

    def describe(self) -> str:
        default = "" if self.server_given else ", default: the cores"
        parts = [f"{self.server} llama-server ({self.flag}{default})"]
        parts += [f"{n} rpc-server {ep}" for ep, n in self.rpc.items()]
        return (f"{self.total} compute threads ({' + '.join(parts)}) on {self.cores} physical "
                f"core{'s' if self.cores != 1 else ''}")


@dataclass(frozen=True)
class MeasuredLink:
    """The link to an RPC device's server as a probe measured it (``backend.rpc_probe``)."""

    gbs: float
    rtt_us: float
    note: str
    graph_us: float = 0.0  # the server's own work on one small graph split (0: not measured)
    mem_total: int | None = None  # bytes the server's device 0 reports as its memory (None: not asked)
    n_devices: int | None = None  # the devices the server serves (None: not asked)


@dataclass(frozen=True)
class DraftThreads:
    """A ``-md`` draft model's threads as its command gives them (None: not given; 0: 0 or below),
    for one token and for a batch, with the flags the notes name them by (mainline's ``-td``/``-tbd``;
    ik_llama.cpp's ``-draft's -t``/``-draft's -tb``)."""

    one: int | None = None
    batch: int | None = None
    one_flag: str = "-td"
    batch_flag: str = "-tbd"


NO_DRAFT_THREADS = DraftThreads()


@dataclass(frozen=True)
class Hardware:
    """The devices' figures for one token (tg), and in :attr:`batch` for a batch of more than one.

    llama.cpp computes a micro-batch of more than one token with ``n_threads_batch`` (``-tb``) and a
    single token with ``n_threads`` (``-t``): pinned build src/llama-context.cpp:2612 ``int n_threads =
    batched ? cparams.n_threads_batch : cparams.n_threads;``, ``batched`` being ``ubatch.n_tokens > 1``
    (:1463); ik_llama.cpp src/llama.cpp:6344 ``n_tokens == 1 ? cparams.n_threads :
    cparams.n_threads_batch``.  Without ``-tb`` the two are one (common/common.cpp:1699
    ``n_threads_batch == -1 ? n_threads``; ik common/common.cpp:4341), and :attr:`batch` is None."""

    devices: dict[str, DeviceSpeed] = field(default_factory=dict)
    threads: Threads | None = None  # on the machine llama-server runs on (None: not known)
    #: the figures of a batch of more than one token (a prompt's micro-batches, the speculative verify
    #: batch) where ``-tb`` makes them differ; None: the same as these
    batch: Hardware | None = None
    #: the figures of a ``-md`` draft model's passes where ``-td``/``-tbd`` make them differ (their own
    #: :attr:`batch` for its batch); None: the same as these
    draft: Hardware | None = None

    def __getitem__(self, name: str) -> DeviceSpeed:
        return self.devices[name]

    def for_tokens(self, n: float) -> Hardware:
        """The figures a pass of ``n`` tokens runs with: :attr:`batch` for more than one token."""
        return self.batch if self.batch is not None and n > 1 else self

    def for_draft(self) -> Hardware:
        """The figures a draft model's passes run with: :attr:`draft`, else these."""
        return self.draft if self.draft is not None else self


# --- figures of each device -------------------------------------------------------------------------


def _pcie_figure(link: tuple[int, int], source: Source, note: str) -> Figure:
    gen, lanes = link
    return Figure(round(pcie_gbs(gen, lanes), 2), "GB/s", source, f"PCIe {gen}.0 x{lanes}; {note}")


def _gpu_bandwidth(dev: Device, decl: Declared, c: Card | None, via: str) -> Figure:
    if decl.bw is not None:
        return Figure(decl.bw, "GB/s", Source.DECLARED, f"{dev.name} bw=")
    if dev.bandwidth_gbs:
        return Figure(dev.bandwidth_gbs, "GB/s", Source.DECLARED, f"{dev.name} bw=")
    if decl.nvml_bus is not None:
        bits, mhz = decl.nvml_bus
        return Figure(round(nvml_bandwidth_gbs(bits, mhz), 1), "GB/s", Source.DRIVER,
                      f"NVML: {bits}-bit memory bus x {mhz} MHz x 2 (double data rate)")
    if c is not None:
        return Figure(c.bandwidth_gbs, "GB/s", Source.CATALOGUE, f"{c.source}; {via}")
    return Figure(DEFAULT_GPU_BW, "GB/s", Source.DEFAULT, f"{dev.name}: no card or bw= given")


def _gpu_tflops(dev: Device, decl: Declared, c: Card | None) -> Figure:
    if decl.tflops is not None:
        return Figure(decl.tflops, "TFLOPS", Source.DECLARED, f"{dev.name} tflops=")
    if c is not None and c.tflops is not None:
        return Figure(c.tflops, "TFLOPS", Source.CATALOGUE, c.source)
    why = "the spec sheet lists none" if c is not None else "no card or tflops= given"
    return Figure(DEFAULT_GPU_TFLOPS, "TFLOPS", Source.DEFAULT, f"{dev.name}: {why}")


def _gpu_link(dev: Device, decl: Declared, c: Card | None, bw: Figure,
              measured: MeasuredLink | str | None = None) -> Figure:
    if dev.kind is DeviceKind.RPC:
        if decl.link is not None:
            return Figure(decl.link, "GB/s", Source.DECLARED, f"{dev.name} link=")
        if isinstance(measured, str):  # the probe failed: why, naming HOST:PORT
            return Figure(DEFAULT_RPC_LINK, "GB/s", Source.DEFAULT,
                          f"{dev.name} {measured}; link assumed {DEFAULT_RPC_LINK:g} GB/s loopback "
                          "(declare it, e.g. link=10Gb/s)")
        if measured is not None:
            return Figure(round(measured.gbs, 4), "GB/s", Source.MEASURED, measured.note)
        return Figure(DEFAULT_RPC_LINK, "GB/s", Source.DEFAULT,
                      f"{dev.name}: network link not declared (e.g. link=10Gb/s); loopback assumed")
    if decl.pcie is not None:
        return _pcie_figure(decl.pcie, Source.DECLARED, f"{dev.name} pcie=")
    if decl.nvml_pcie is not None:
        return _pcie_figure(decl.nvml_pcie, Source.DRIVER, "NVML: the link's maximum generation and width")
    if c is not None and c.pcie is None:
        return Figure(bw.value, "GB/s", bw.source, "unified memory: the GPU reads host memory directly")
    if c is not None and c.pcie is not None:
        return _pcie_figure(c.pcie, Source.CATALOGUE, c.source)
    return _pcie_figure(DEFAULT_PCIE, Source.DEFAULT, f"{dev.name}: no card or pcie= given")


def _rpc_latency(link: MeasuredLink) -> Figure:
    """What the probe measured of one RPC graph split: the network round trip (the activations read
    back after an asynchronous graph compute, ggml-rpc protocol 7) and the server's work on a graph."""
    server = f" and the server's work on a graph, {link.graph_us:.0f} µs" if link.graph_us else ""
    return Figure(round(link.rtt_us + link.graph_us, 1), "µs per RPC graph split", Source.MEASURED,
                  f"one network round trip per split, {link.rtt_us:.0f} µs,{server} beside the host's work "
                  f"per split; {link.note}")


def gpu_speed(dev: Device, link: MeasuredLink | str | None = None) -> DeviceSpeed:
    """A GPU's (or an RPC device's) figures: declared keys first, then its card, then defaults;
    ``link``: an RPC device's link as measured (used unless ``link=`` is declared), or why its probe
    failed."""
    decl = parse_hardware_keys(dev.hardware)
    c = decl.card or (card(dev.description) if dev.description else None)
    via = (f"{dev.name} declared as {c.key}" if decl.card and c
           else f"{dev.name} reported as {dev.description!r}")
    bw = _gpu_bandwidth(dev, decl, c, via)
    rpc = dev.kind is DeviceKind.RPC
    latency = _rpc_latency(link) if rpc and isinstance(link, MeasuredLink) and decl.link is None else None
    return DeviceSpeed(dev.name, dev.kind, bw, _gpu_tflops(dev, decl, c), _gpu_link(dev, decl, c, bw, link),
                       c.name if c else "", threads=decl.threads if rpc else None,
                       unified=c is not None and c.pcie is None, latency_us=latency)


def _isa(decl: Declared, cpu: CpuInfo | None) -> tuple[float, str, Isa | None]:
    """(gain over an AVX2 core, what the compute note says of it, the tier): the declared ``isa=``, else
    the one ``cpu`` (this machine's, read by backend.speed_store.this_cpu) says, else none (the AVX2
    figure)."""
    if decl.isa is not None:
        return GAINS[decl.isa].value, _isa_note(decl.isa, "isa="), decl.isa
    if cpu is None:
        return 1.0, "", None
    if cpu.isa is None:
        return 1.0, f"; {cpu.describe()}: the AVX2 figure", None
    return GAINS[cpu.isa].value, _isa_note(cpu.isa, f"{cpu.model or 'the CPU'} per {cpu.source}"), cpu.isa


def _isa_note(isa: Isa, where: str) -> str:
    g = GAINS[isa]
    return f"; {isa.value} ({where}): {g.value:g} x the AVX2 figure ({g.why})"


def host_speed(dev: Device, *, threads: int | None = None, probe: Figure | None = None,
               default_threads: int | None = None, smt_capped: bool = True,
               cpu: CpuInfo | None = None, flag: str = "-t") -> DeviceSpeed:
    """The host's figures: declared bw=/ram=, else the probe's measurement, else a default.  Threads:
    ``-t`` (``threads``) or the declared ``threads=``, else llama.cpp's default, the physical cores
    (``common_cpu_get_num_math``): the declared ``cores=``, else ``default_threads`` (this machine's).
    More compute threads than declared cores add no compute ("hyperthreading isn't useful for linear
    algebra", the same function) unless ``smt_capped`` is off (``Threads`` shares the cores instead).
    A core's compute: the AVX2 figure times its instruction set's gain (declared ``isa=``, else
    ``cpu``'s), at the declared ``ghz=``, else the clock ``cpu``'s model name states; ``tflops=``
    declared replaces all of it.  ``flag``: where ``threads`` came from, as the notes name it (``-tb``
    for a batch's figures: :attr:`Hardware.batch`)."""
    decl = parse_hardware_keys(dev.hardware)
    if decl.bw is not None or dev.bandwidth_gbs:
        bw = Figure(decl.bw or dev.bandwidth_gbs or 0.0, "GB/s", Source.DECLARED, "CPU bw=")
    elif decl.ram is not None:
        # not rounded to 0 (ram=1xDDR5-1 is 0.008 GB/s): the estimate divides by it
        bw = Figure(round(decl.ram, 1) or decl.ram, "GB/s", Source.DECLARED,
                    "CPU ram= (channels x MT/s x 8 B)")
    elif probe is not None:
        bw = probe
    else:
        bw = Figure(DEFAULT_HOST_BW, "GB/s", Source.DEFAULT, "no RAM probe or CPU bw=/ram= given")
    n = decl.threads or threads
    isa: Isa | None = None
    if decl.tflops is not None:
        tf = Figure(decl.tflops, "TFLOPS", Source.DECLARED, "CPU tflops=")
    else:
        cores = decl.cores or default_threads
        tn = n or cores or DEFAULT_THREADS
        why = ("" if n else f" ({flag} not given: llama.cpp's default, the {cores} physical cores)" if cores
               else f" (threads not given: {flag})")
        if n and decl.cores and n > decl.cores and smt_capped:
            tn, why = decl.cores, f" ({flag} {n} on {decl.cores} physical cores: the rest add no compute)"
        gain, isa_note, isa = _isa(decl, cpu)
        per, src, clock = DEFAULT_CPU_TFLOPS_PER_THREAD * gain, Source.DEFAULT, ""
        ghz = decl.ghz if decl.ghz is not None else cpu.ghz if cpu is not None else None
        if ghz is not None:
            per = per * ghz / DEFAULT_CPU_GHZ
            src = Source.DECLARED if decl.ghz is not None else src
            said = f"ghz={ghz:g}" if decl.ghz is not None else f"{ghz:g} GHz in its model name"
            clock = f" ({said}: {DEFAULT_CPU_TFLOPS_PER_THREAD} TFLOPS a core at {DEFAULT_CPU_GHZ} GHz)"
        tf = Figure(round(tn * per, 3) or tn * per, "TFLOPS", src,  # not 0: ghz=0.0001 divided by it
                    f"{tn} threads x {per:.4g} TFLOPS{clock}{why}{isa_note}")
    link = Figure(bw.value, "GB/s", bw.source, "host memory")
    return DeviceSpeed(dev.name, DeviceKind.CPU, bw, tf, link, threads=n,
                       isa_gain=1.0 if decl.tflops is not None else gain, isa=isa, threads_flag=flag)


def local_cpu_rpc(base: DeviceSpeed, dev: Device, evidence: str, threads: int, *, probe: Figure | None,
                  cpu: CpuInfo | None) -> DeviceSpeed:
    """An RPC device whose rpc-server computes with ggml's CPU backend on this machine (``evidence``:
    why that is known, backend.speed_store.cpu_backend_evidence): this machine's CPU figures for its
    server's ``threads`` (its ``-t``: declared ``threads=``, else rpc-server.cpp's default
    ``hardware_concurrency() / 2``).  Its memory is the RAM the host CPU reads (the RAM probe's figure:
    the devices of a token run one after another, so each reads it alone), its compute ``threads`` x
    this machine's core (instruction set and clock, as :func:`host_speed`); declared ``bw=`` and
    ``tflops=`` still win (``base``: its figures as :func:`gpu_speed` gave them)."""
    decl = parse_hardware_keys(dev.hardware)
    bw = base.bandwidth
    if decl.bw is None and not dev.bandwidth_gbs:
        bw = (Figure(probe.value, probe.unit, probe.source, f"{evidence}: {probe.note}") if probe is not None
              else Figure(DEFAULT_HOST_BW, "GB/s", Source.DEFAULT, f"{evidence}: no RAM probe"))
    as_cpu = host_speed(Device(dev.name, DeviceKind.CPU), threads=threads, cpu=cpu, smt_capped=False,
                        flag="rpc-server -t")
    tf, gain, isa = base.tflops, 1.0, None
    if decl.tflops is None:
        tf = replace(as_cpu.tflops, note=f"{evidence}: {as_cpu.tflops.note}")
        gain, isa = as_cpu.isa_gain, as_cpu.isa
    return replace(base, bandwidth=bw, tflops=tf, threads=threads, isa_gain=gain, isa=isa, cpu_backend=True)


def hardware_for(devices: DeviceSet, *, threads: int | None = None, probe: Figure | None = None,
                 overrides: Mapping[str, DeviceSpeed] | None = None,
                 links: Mapping[str, MeasuredLink | str] | None = None, cores: Threads | None = None,
                 cpu: CpuInfo | None = None, thread_bw: Mapping[str, Figure] | None = None,
                 threads_batch: int | None = None, cpu_rpc: Mapping[str, str] | None = None,
                 draft_threads: DraftThreads = NO_DRAFT_THREADS) -> Hardware:
    """Figures of every device of the set (``overrides`` replace whole devices, e.g. calibrated;
    ``links``: measured links of RPC devices by endpoint (or why the probe failed); ``cores``: the
    threads on this machine, which slow its devices down by ``cores / threads`` when more threads than
    cores compute;
    ``cpu``: this machine's CPU as the operating system describes it, its instruction set and clock;
    ``thread_bw``: one thread's measured copy rate of the devices, by name, whose threads run on the
    probed machine; ``threads_batch``: ``-tb`` (0: ``-tb`` 0 or below), the threads of a batch of more
    than one token, whose figures are :attr:`Hardware.batch` where they differ from ``-t``'s);
    ``cpu_rpc``: the RPC devices, by name, whose server is this machine's CPU backend, with the evidence
    (:func:`local_cpu_rpc`); ``draft_threads``: a draft model's threads as given, its figures where they
    differ (:attr:`Hardware.draft`, :func:`_draft`)."""
    links = links or {}
    gpus = {g.name: gpu_speed(g, links.get(g.endpoint) if g.endpoint else None) for g in devices.gpus}
    for g in devices.gpus:
        if cpu_rpc and g.name in cpu_rpc:
            n = (cores.rpc.get(g.endpoint) if cores is not None else None) or gpus[g.name].threads or 1
            gpus[g.name] = local_cpu_rpc(gpus[g.name], g, cpu_rpc[g.name], n, probe=probe, cpu=cpu)
    host = host_speed(devices.cpu, threads=threads, probe=probe,
                      default_threads=cores.server if cores is not None else None,
                      smt_capped=cores is None, cpu=cpu)
    one = _assembled(gpus, host, thread_bw, overrides, cores)

    def with_threads(n: int, flag: str) -> Hardware:
        # -tb, -td, -tbd stand alone: a declared threads= is the CPU's -t (host_speed), not theirs
        own = replace(devices.cpu, hardware=tuple(kv for kv in devices.cpu.hardware if kv[0] != "threads"))
        h = host_speed(own, threads=n, probe=probe, smt_capped=cores is None, cpu=cpu, flag=flag)
        c = replace(cores, server=n, server_given=True, flag=flag) if cores is not None else None
        return _assembled(gpus, h, thread_bw, overrides, c)

    tb = _batch_threads(threads_batch, devices.cpu, host, cores)
    out = one if tb is None else replace(one, batch=with_threads(tb, "-tb"))
    return _draft(out, draft_threads, devices.cpu, cores, with_threads)


def _draft(hw: Hardware, given: DraftThreads, dev: Device, cores: Threads | None,
           with_threads: Callable[[int, str], Hardware]) -> Hardware:
    """``hw`` with :attr:`Hardware.draft` where ``-td``/``-tbd`` (``given``) make a draft model's
    threads differ from the target's.  The pinned build (common/arg.cpp:889-890) takes a draft's
    ``cpuparams`` from ``-td``, else the target's ``-t``, and its ``cpuparams_batch`` from ``-tbd``,
    else the target's batch threads (``-tb``, else ``-t``: not ``-td``'s, whatever ``-tbd``'s help
    says), and gives them to the draft model's context (common/speculative.cpp:2553-2555, inside
    ``if (has_draft)``: an MTP head on the target model keeps the target's); 0 or below is
    ``std::thread::hardware_concurrency()``, taken as the cores as ``-tb`` 0 is.  The 2025 builds
    the same (tools/server/server.cpp ``params_dft.cpuparams.n_threads =
    params_base.speculative.cpuparams.n_threads``).  ik_llama.cpp builds the draft's context from
    the target's command line (common/speculative.cpp:1946 ``params_dft = params_base``) and reads
    either flag: the draft's threads are its ``-draft "ARGS"``'s ``-t``/``-tb`` there (the batch's,
    not given anywhere, the draft's ``-t``: backend.speed_store ``draft_threads_of``)."""
    td, tbd = given.one, given.batch
    if td is None and tbd is None:
        return hw
    decl = parse_hardware_keys(dev.hardware)
    known = (cores.cores if cores is not None else decl.cores) or DEFAULT_THREADS
    cpu = dev.name
    one_n = hw[cpu].threads or known
    batch_n = hw.for_tokens(2)[cpu].threads or known
    d_one = one_n if td is None else td or known
    d_batch = batch_n if tbd is None else tbd or known
    if d_one == one_n and d_batch == batch_n:
        return hw
    draft_one = replace(hw, batch=None) if d_one == one_n else with_threads(d_one, given.one_flag)
    if d_batch == d_one:
        return replace(hw, draft=draft_one)
    draft_batch = hw.for_tokens(2) if tbd is None else with_threads(d_batch, given.batch_flag)
    return replace(hw, draft=replace(draft_one, batch=replace(draft_batch, batch=None)))


def _assembled(gpus: Mapping[str, DeviceSpeed], host: DeviceSpeed, thread_bw: Mapping[str, Figure] | None,
               overrides: Mapping[str, DeviceSpeed] | None, cores: Threads | None) -> Hardware:
    """The devices' figures with the host's ``host``: each one thread's copy rate, the overrides, and
    the share of a core each thread of a device computing here gets when its own threads outnumber
    the ``cores``."""
    out = {**gpus, host.name: host}
    for name, fig in (thread_bw or {}).items():
        if name in out:
            out[name] = replace(out[name], thread_bandwidth=fig)
    out.update(overrides or {})
    if cores is not None and cores.oversubscribed:
        out = {k: replace(v, share=cores.share_of(k)) if k in cores.local else v for k, v in out.items()}
    return Hardware(out, cores)


def _batch_threads(given: int | None, dev: Device, host: DeviceSpeed, cores: Threads | None) -> int | None:
    """The threads of a batch of more than one token where they differ from one token's (``host``'s),
    else None.  ``-tb N`` (common/arg.cpp:1529-1538; ik common/common.cpp:1147) is N; 0 or below is
    ``std::thread::hardware_concurrency()``, taken as the cores as ``-t`` 0 is (the physical cores:
    ``cores``, else the declared ``cores=``); not given, the batch takes ``-t``'s threads
    (postprocess_cpu_params(cpuparams_batch, &cpuparams), common/arg.cpp:887 and common/common.cpp:296;
    ik: ``n_threads_batch == -1 ? n_threads``, common/common.cpp:4341).  Neither build reads an
    environment variable for it (no ``set_env`` on ``-tb``; ik's ``gpt_params_parse_from_env`` reads
    ``LLAMA_ARG_THREADS`` only, common/common.cpp:804)."""
    if given is None:
        return None
    decl = parse_hardware_keys(dev.hardware)
    known = cores.cores if cores is not None else decl.cores
    one = host.threads or (cores.server if cores is not None else decl.cores) or DEFAULT_THREADS
    tb = given if given > 0 else known or DEFAULT_THREADS
    return None if tb == one else tb
