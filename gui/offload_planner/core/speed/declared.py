"""The speed keys of a ``--device`` declaration (``bw=936GB/s``, ``pcie=4x16``, ``tflops=71``,
``ram=12xDDR5-4800``, ``link=10Gb/s``, ``threads=16``, ``cores=32``, ``ghz=2.4``, ``isa=avx512_vnni``,
a catalogue card),
checked and converted.

Apart from :mod:`offload_planner.core.speed.hardware` (which turns them into figures) so that
:func:`offload_planner.core.devices.parse_device_decl` can check them without an import cycle.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from offload_planner.core.speed.catalogue import Card, card, card_keys
from offload_planner.core.speed.cpu_isa import Isa, parse_isa

#: Per-lane PCIe throughput per direction in GB/s after line coding (PCI-SIG: 8, 16, 32 GT/s with
#: 128b/130b encoding for gen 3-5; 2.5 and 5 GT/s with 8b/10b for gen 1-2; gen 6 64 GT/s PAM4).
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

HARDWARE_KEYS = ("bw", "bandwidth", "pcie", "tflops", "ram", "link", "threads", "cores", "ghz", "isa")

#: The largest figure a speed key takes (1 PB/s, 10^6 TFLOPS, 65536 threads): far beyond any device,
#: small enough that the estimate's arithmetic stays finite (a 400-digit bw= was infinity).
MAX_RATE_GBS = 1e6
MAX_TFLOPS = 1e6
MAX_THREADS = 1 << 16
MAX_GHZ = 10.0
#: The smallest (1 byte/s, 1 FLOP/s, 1 kHz): far below any device, large enough that the estimate's
#: arithmetic stays finite and non-zero (tflops=4e-324, a subnormal, times the efficiency was 0.0 and
#: fit died dividing by it; a 318-zero bw= made a token's time infinite).
MIN_RATE_GBS = 1e-9
MIN_TFLOPS = 1e-12
MIN_GHZ = 1e-6

_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z/]*)\s*$", re.ASCII)
#: A number as tflops= and ghz= take it: ASCII digits, a decimal point, an exponent (float() also took
#: '1_0' as 10 and other scripts' digits, where threads= and cores= refused them)
_NUMBER_RE = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:e[-+]?[0-9]+)?|\.[0-9]+(?:e[-+]?[0-9]+)?", re.ASCII)


def _number(text: str) -> float:
    """:data:`_NUMBER_RE` as a float; ValueError for anything else."""
    if _NUMBER_RE.fullmatch(text) is None:
        raise ValueError(text)
    return float(text)
_RATE_UNITS = {"": 1.0, "gb/s": 1.0, "tb/s": 1000.0, "mb/s": 0.001, "gib/s": 1.073741824}


def parse_rate(text: str, *, bits: bool = False) -> float:
    """``936GB/s``, ``3.35TB/s``, ``936`` (GB/s) -> GB/s; with ``bits`` (network links) ``10Gb/s``,
    ``10Gbit/s``, ``10GbE`` count bits (GB/s is still accepted with a capital B)."""
    m = _RATE_RE.match(text)
    if m is None:
        raise ValueError(f"not a rate: {text!r} (use e.g. 936GB/s)")
    value, unit = float(m.group(1)), m.group(2)
    if value <= 0:
        raise ValueError(f"not a positive rate: {text!r}")
    if bits and re.fullmatch(r"[GMT]b(/s|it/s|ps|E)", unit):
        gbs = value * {"G": 1.0, "M": 0.001, "T": 1000.0}[unit[0]] / 8
    elif unit.lower() in _RATE_UNITS:
        gbs = value * _RATE_UNITS[unit.lower()]
    else:
        raise ValueError(f"unknown rate unit in {text!r} (use GB/s, TB/s" + (", Gb/s" if bits else "") + ")")
    if not gbs <= MAX_RATE_GBS:  # also infinity (a 400-digit number)
        raise ValueError(f"rate {text!r} is too large (at most {MAX_RATE_GBS:g} GB/s)")
    if gbs < MIN_RATE_GBS:
        raise ValueError(f"rate {text!r} is too small (at least {MIN_RATE_GBS:g} GB/s, one byte per second)")
    return gbs


def parse_pcie(text: str) -> tuple[int, int]:
    """``4x16`` (generation 4, 16 lanes), ``gen4x8``."""
    m = re.fullmatch(r"\s*(?:gen)?(\d)\s*x\s*(\d+)\s*", text.lower(), re.ASCII)
    if m is None or int(m.group(1)) not in PCIE_LANE_GBS or int(m.group(2)) not in (1, 2, 4, 8, 16):
        raise ValueError(f"not a PCIe link: {text!r} (use GENxLANES, e.g. 4x16 or 3x8)")
    return int(m.group(1)), int(m.group(2))


def parse_ram(text: str) -> float:
    """``12xDDR5-4800`` -> channels x MT/s x 8 bytes in GB/s (460.8)."""
    m = re.fullmatch(r"\s*(\d+)\s*x\s*(?:L?P?DDR\d[XA-Z]*)[-_ ]?(\d+)\s*", text, re.IGNORECASE | re.ASCII)
    if m is None or int(m.group(1)) == 0 or int(m.group(2)) == 0:
        raise ValueError(f"not a RAM configuration: {text!r} (use CHANNELSxDDRn-MTs, e.g. 12xDDR5-4800)")
    gbs = int(m.group(1)) * int(m.group(2)) * 8 / 1000
    if gbs > MAX_RATE_GBS:
        raise ValueError(f"RAM configuration {text!r} is too fast (at most {MAX_RATE_GBS:g} GB/s)")
    return gbs


def parse_tflops(text: str) -> float:
    try:
        v = _number(text.strip().lower().removesuffix("tflops"))
    except ValueError:
        raise ValueError(f"not a TFLOPS figure: {text!r} (use e.g. tflops=71)") from None
    if not MIN_TFLOPS <= v <= MAX_TFLOPS:  # also refuses nan and inf, which float() takes
        raise ValueError(f"not a TFLOPS figure from {MIN_TFLOPS:g} to {MAX_TFLOPS:g}: {text!r}")
    return v


def parse_ghz(text: str) -> float:
    """A CPU core's clock in GHz (``ghz=2.25``, ``ghz=2250MHz``)."""
    t = text.strip().lower()
    scale = 0.001 if t.endswith("mhz") else 1.0
    try:
        v = _number(t.removesuffix("mhz").removesuffix("ghz")) * scale
    except ValueError:
        raise ValueError(f"not a clock: {text!r} (use e.g. ghz=2.4)") from None
    if not MIN_GHZ <= v <= MAX_GHZ:  # also refuses nan and inf
        raise ValueError(f"not a clock from {MIN_GHZ:g} to {MAX_GHZ:g} GHz: {text!r}")
    return v


@dataclass(frozen=True)
class Declared:
    """The speed keys of one ``--device`` value, checked and converted."""

    card: Card | None = None
    bw: float | None = None  # GB/s
    link: float | None = None  # GB/s (network, RPC)
    pcie: tuple[int, int] | None = None
    ram: float | None = None  # GB/s from channels x MT/s x 8 B
    tflops: float | None = None
    threads: int | None = None
    cores: int | None = None  # the host's physical cores (a machine other than this one)
    ghz: float | None = None  # the host's core clock (vendor base clock)
    isa: Isa | None = None  # the host's instruction-set tier (core.speed.cpu_isa)
    nvml_bus: tuple[int, int] | None = None  # bus width in bits, max memory clock in MHz (NVML)
    nvml_pcie: tuple[int, int] | None = None  # max PCIe generation, width (NVML)


def _parse_nvml_bus(val: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)", val.strip())
    if m is None or not int(m.group(1)) or not int(m.group(2)):
        raise ValueError(f"nvml_bus={val!r}: expected BITSxMHZ, e.g. 384x9751")
    return int(m.group(1)), int(m.group(2))


def parse_hardware_keys(parts: Sequence[tuple[str, str]]) -> Declared:
    """Check and convert the speed keys of one ``--device`` value (ValueError names the key)."""
    d: dict[str, object] = {}
    for key, val in parts:
        k = "bw" if key == "bandwidth" else key
        if k == "card":
            c = card(val)
            if c is None:
                raise ValueError(f"unknown card {val!r} (known: {', '.join(card_keys())})")
            d[k] = c
        elif k == "bw":
            d[k] = parse_rate(val)
        elif k == "link":
            d[k] = parse_rate(val, bits=True)
        elif k == "pcie":
            d[k] = parse_pcie(val)
        elif k == "ram":
            d[k] = parse_ram(val)
        elif k == "tflops":
            d[k] = parse_tflops(val)
        elif k == "ghz":
            d[k] = parse_ghz(val)
        elif k == "isa":
            d[k] = parse_isa(val)
        elif k == "nvml_bus":
            d[k] = _parse_nvml_bus(val)
        elif k == "nvml_pcie":
            d[k] = parse_pcie(val)
        elif k in ("threads", "cores"):
            if not val.strip().isascii() or not val.strip().isdigit() or not 1 <= int(val) <= MAX_THREADS:
                raise ValueError(f"{k}={val!r}: not a count from 1 to {MAX_THREADS}")
            d[k] = int(val)
        else:
            raise ValueError(f"unknown field {key!r}")
    return Declared(**d)  # type: ignore[arg-type]
