"""Registering mapped shards with CUDA, read-only, for DMA.

A shard mapped from a ckptfs mount whose file is resident in the host tier
is, under FUSE passthrough, a mapping of the daemon's sealed, verified
memfd pages. cudaHostRegister(..., cudaHostRegisterReadOnly) pins those
pages for the device without asking to write them, so a tensor copied from
the mapping to the GPU is one DMA from the verified pages, with no bounce
buffer. Without CUDA, or when the device refuses (no read-only
registration, RLIMIT_MEMLOCK), the shard is copied as pageable memory.

The registrar is an interface so the load logic is tested on machines with
no GPU; CudaRegistrar is the one that talks to the device, through torch's
binding of the CUDA runtime (torch.cuda.cudart()).
"""
from __future__ import annotations

from typing import List, Optional, Protocol, Tuple

CUDA_HOST_REGISTER_PORTABLE = 0x01
CUDA_HOST_REGISTER_READ_ONLY = 0x08


class Registrar(Protocol):
    name: str

    def register(self, address: int, size: int) -> Optional[str]:
        """Pins [address, address + size) for the device; None on success, else why not."""

    def unregister(self, address: int) -> Optional[str]:
        """Undoes register(); None on success, else why not."""

    def synchronize(self) -> None:
        """Waits for every copy in flight (before unregistering their source)."""


class CudaRegistrar:
    name = "cudaHostRegister (read-only, portable)"

    def __init__(self) -> None:
        import torch
        self._torch = torch
        self._cudart = torch.cuda.cudart()
        self._success = int(getattr(self._cudart.cudaError, "success", 0))

    def _why(self, err: object) -> Optional[str]:
        code = int(err)  # type: ignore[call-overload]
        if code == self._success:
            return None
        text = ""
        try:
            text = self._cudart.cudaGetErrorString(err)
        except Exception:
            pass
        return f"CUDA error {code}" + (f" ({text})" if text else "")

    def register(self, address: int, size: int) -> Optional[str]:
        flags = CUDA_HOST_REGISTER_PORTABLE | CUDA_HOST_REGISTER_READ_ONLY
        return self._why(self._cudart.cudaHostRegister(address, size, flags))

    def unregister(self, address: int) -> Optional[str]:
        return self._why(self._cudart.cudaHostUnregister(address))

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()


def cuda_registrar() -> Tuple[Optional[Registrar], str]:
    """The registrar for this process, or None and why there is none."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    try:
        if not torch.cuda.is_available():
            return None, "CUDA absent (torch.cuda.is_available() is false)"
        from vllm.platforms import current_platform
        if not current_platform.is_cuda():
            return None, f"platform {current_platform.device_name!r} is not CUDA"
        cudart = torch.cuda.cudart()
        if not hasattr(cudart, "cudaHostRegister") or not hasattr(cudart, "cudaHostUnregister"):
            return None, "this torch has no cudaHostRegister binding"
        return CudaRegistrar(), "CUDA present"
    except Exception as e:  # a broken driver must not stop the load
        return None, f"CUDA unusable ({e})"


class Mapping(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def address(self) -> int: ...

    @property
    def size(self) -> int: ...


class Registrations:
    """The mappings registered during one load, unregistered together after
    it. Each registered mapping is held here until then: unmapping pages the
    device still has registered is not allowed."""

    def __init__(self, registrar: Optional[Registrar]) -> None:
        self.registrar = registrar
        self.registered: List[Mapping] = []
        self.refused: List[Tuple[str, str]] = []  # (shard, why)

    def register(self, mapping: Mapping) -> bool:
        if self.registrar is None:
            return False
        why = self.registrar.register(mapping.address, mapping.size)
        if why is not None:
            self.refused.append((mapping.path, why))
            return False
        self.registered.append(mapping)
        return True

    def release(self) -> List[str]:
        """Unregisters everything (after the copies in flight); returns the failures, one line each."""
        failures: List[str] = []
        if self.registrar is None or not self.registered:
            return failures
        self.registrar.synchronize()
        for mapping in self.registered:
            why = self.registrar.unregister(mapping.address)
            if why is not None:
                failures.append(f"{mapping.path}: {why}")
        return failures
