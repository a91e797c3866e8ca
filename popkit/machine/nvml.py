"""The NVIDIA GPUs a CUDA program would see, from the driver's management library (NVML), without torch.

A run's report names the card; learning it through torch costs a second interpreter importing torch and
opening a CUDA context beside the eval (seconds of CPU, and a context on the GPU under test). NVML answers
in milliseconds and opens no context. visible_gpus() answers only where its answer is the one torch would
give, and None otherwise, so the caller falls back to asking torch:
- no libnvidia-ml (no NVIDIA driver, an AMD machine) or an NVML call fails;
- CUDA_VISIBLE_DEVICES names devices by UUID or MIG instance (only indices are mapped here);
- the visible GPUs are not all the same model: CUDA's default order (fastest first) may then differ from
  NVML's (PCI bus order), and "GPU 0" would be ambiguous;
- a GPU is in MIG mode: CUDA then sees its instances (a slice of the memory, a name of its own), not it.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Mapping

LIBRARY = "libnvidia-ml.so.1"
_SUCCESS = 0


@dataclass(frozen=True)
class Gpu:
    name: str
    arch: str  # sm_90
    memory: int  # bytes, as CUDA counts them (torch's total_memory)


@dataclass(frozen=True)
class Driver:
    cuda: tuple[int, int]  # the newest CUDA version the driver supports: (13, 0)
    gpus: tuple[Gpu, ...]  # those CUDA_VISIBLE_DEVICES leaves visible, in CUDA's order


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _MemoryV2(ctypes.Structure):  # nvmlMemory_v2_t: `reserved` is the driver's share of `total`
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def _memory(lib: Any, handle: ctypes.c_void_p) -> int:
    """What CUDA reports as the card's total memory (cudaDeviceProp.totalGlobalMem): NVML's total less the
    driver's reserved part (equal to the byte on an H100), or NVML's plain total where the driver is too old
    to say what it reserves."""
    memory = _MemoryV2(version=ctypes.sizeof(_MemoryV2) | 2 << 24)
    query_v2 = getattr(lib, "nvmlDeviceGetMemoryInfo_v2", None)
    if query_v2 is not None and query_v2(handle, ctypes.byref(memory)) == _SUCCESS:
        return int(memory.total - memory.reserved)
    plain = _Memory()
    _call(lib, "nvmlDeviceGetMemoryInfo", handle, ctypes.byref(plain))
    return int(plain.total)


def visible_indices(value: str | None, count: int) -> list[int] | None:
    """The driver's device indices CUDA would use under CUDA_VISIBLE_DEVICES=`value`; None for forms not mapped.

    CUDA reads the list up to its first entry that is not a valid index and ignores the rest; a repeated
    index ends the list too.
    """
    if value is None:
        return list(range(count))
    picked: list[int] = []
    for entry in value.split(","):
        entry = entry.strip()
        if entry.upper().startswith(("GPU-", "MIG-")):
            return None  # a UUID: mapping it needs nvmlDeviceGetUUID; torch answers instead
        try:
            index = int(entry)
        except ValueError:
            break
        if index < 0 or index >= count or index in picked:
            break
        picked.append(index)
    return picked


def _mig_enabled(lib: Any, handle: ctypes.c_void_p) -> bool:
    """Whether MIG mode is on; a GPU without MIG answers "not supported", which is off."""
    current, pending = ctypes.c_uint(), ctypes.c_uint()
    query = getattr(lib, "nvmlDeviceGetMigMode", None)
    return query is not None and query(handle, ctypes.byref(current), ctypes.byref(pending)) == _SUCCESS \
        and current.value == 1


def _call(lib: Any, name: str, *args: Any) -> None:
    if getattr(lib, name)(*args) != _SUCCESS:
        raise OSError(f"{name} failed")


def query(lib: Any, env: Mapping[str, str]) -> Driver | None:
    """What the driver behind `lib` (a loaded NVML) says CUDA would see under `env`; None where unsure."""
    _call(lib, "nvmlInit_v2")
    try:
        version = ctypes.c_int()
        _call(lib, "nvmlSystemGetCudaDriverVersion_v2", ctypes.byref(version))
        count = ctypes.c_uint()
        _call(lib, "nvmlDeviceGetCount_v2", ctypes.byref(count))
        indices = visible_indices(env.get("CUDA_VISIBLE_DEVICES"), count.value)
        if indices is None:
            return None
        gpus = []
        for index in indices:
            handle = ctypes.c_void_p()
            _call(lib, "nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
            if _mig_enabled(lib, handle):
                return None
            name = ctypes.create_string_buffer(96)
            _call(lib, "nvmlDeviceGetName", handle, name, ctypes.c_uint(len(name)))
            major, minor = ctypes.c_int(), ctypes.c_int()
            _call(lib, "nvmlDeviceGetCudaComputeCapability", handle, ctypes.byref(major), ctypes.byref(minor))
            gpus.append(Gpu(name.value.decode("utf-8", "replace"), f"sm_{major.value}{minor.value}",
                            _memory(lib, handle)))
    finally:
        lib.nvmlShutdown()
    if len({gpu.name for gpu in gpus}) > 1:
        return None
    return Driver((version.value // 1000, version.value % 1000 // 10), tuple(gpus))


def visible_gpus(env: Mapping[str, str], library: str = LIBRARY) -> Driver | None:
    """query() through the system's NVML; None where there is none or it cannot answer."""
    try:
        return query(ctypes.CDLL(library), env)
    except (OSError, AttributeError):
        return None


def driver_version(lib: Any) -> str:
    """The driver's version (`580.65.06`) from a loaded NVML."""
    _call(lib, "nvmlInit_v2")
    try:
        text = ctypes.create_string_buffer(96)
        _call(lib, "nvmlSystemGetDriverVersion", text, ctypes.c_uint(len(text)))
        return text.value.decode("ascii", "replace")
    finally:
        lib.nvmlShutdown()


def system_driver_version(library: str = LIBRARY) -> str | None:
    """driver_version() through the system's NVML; None where there is none (no NVIDIA driver) or it fails."""
    try:
        return driver_version(ctypes.CDLL(library))
    except (OSError, AttributeError):
        return None


# ------------------------------------------------------------------------------------ the GPU's state

_CLOCK_SM, _CLOCK_MEM = 1, 2  # nvmlClockType_t
_TEMPERATURE_GPU = 0


@dataclass(frozen=True)
class Reading:
    """One look at a GPU: clocks (MHz), temperature (°C), power (W), and the driver's clock-event reasons (bits)."""

    sm_mhz: int
    mem_mhz: int
    temp_c: int
    power_w: float
    reasons: int


def handle(lib: Any, index: int) -> ctypes.c_void_p:
    """The NVML handle of the driver's device `index` (nvmlInit_v2 must have run)."""
    found = ctypes.c_void_p()
    _call(lib, "nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(found))
    return found


def read(lib: Any, device: ctypes.c_void_p) -> Reading:
    """The state of one GPU now; a quantity the driver does not report reads 0."""
    def uint(name: str, *args: Any) -> int:
        value = ctypes.c_uint()
        query = getattr(lib, name, None)
        return value.value if query is not None and query(device, *args, ctypes.byref(value)) == _SUCCESS else 0

    reasons = ctypes.c_ulonglong()
    query = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        lib, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    got = query is not None and query(device, ctypes.byref(reasons)) == _SUCCESS
    return Reading(sm_mhz=uint("nvmlDeviceGetClockInfo", ctypes.c_uint(_CLOCK_SM)),
                   mem_mhz=uint("nvmlDeviceGetClockInfo", ctypes.c_uint(_CLOCK_MEM)),
                   temp_c=uint("nvmlDeviceGetTemperature", ctypes.c_uint(_TEMPERATURE_GPU)),
                   power_w=uint("nvmlDeviceGetPowerUsage") / 1000.0, reasons=reasons.value if got else 0)
