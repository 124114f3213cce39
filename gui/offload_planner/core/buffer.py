"""One buffer llama.cpp allocates on a device (its name as llama.cpp logs it), with how it was
computed: what the memory model, the compute simulation and the window's bars all speak."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Buffer:
    device: str
    name: str  # as llama.cpp logs it: CUDA0, CPU_Mapped, CUDA_Host, RPC0, ...
    kind: str  # model | kv | compute | output
    bytes: int
    why: str
    resident: int | None = None  # mmap buffers: bytes actually read (the rest of the span is gaps)
    owner: str = ""  # "" for the main model; else the key of the extra model/context (core.extra_context)
    tensor_bytes: int | None = None  # mmap buffers: bytes of the device's own tensors in the span

    def copy(self) -> Buffer:
        """A shallow copy: ``dataclasses.replace(self)`` in a fraction of its time (memos hand their
        buffers out as copies at every projection)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new


#: ik's CPU buffer type allocates ``size + TENSOR_ALIGNMENT`` (``ggml_backend_cpu_buffer_type_alloc_buffer``).
IK_CPU_BUFFER_EXTRA = 32
