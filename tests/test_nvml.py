"""The torch-free system probe: NVML read through a fake driver library, and when torch must answer instead."""

from __future__ import annotations

import ctypes
import json
import os
import stat
import subprocess
import sys

import pytest

from popkit.machine import nvml
from popkit.machine import system

# name, compute capability, NVML's total memory, the driver's reserved part (as an H100 with driver 580 reports)
H100 = ("NVIDIA H100 80GB HBM3", (9, 0), 85_520_809_984, 503_316_480)
A100 = ("NVIDIA A100-SXM4-80GB", (8, 0), 85_899_345_920, 450_887_680)
H100_CUDA_MEMORY = 85_017_493_504  # torch.cuda.get_device_properties(0).total_memory on that H100


class FakeNvml:
    """The NVML calls popkit makes, answering through ctypes out-parameters as the real library does."""

    def __init__(self, gpus, driver_cuda=13000, fail="", v2=True, mig=None):
        self.gpus, self.driver_cuda, self.fail, self.v2, self.mig = gpus, driver_cuda, fail, v2, mig
        self.shut = False

    def __getattr__(self, name):
        if name == self.fail:
            return lambda *args: 999
        if name.endswith("_v2") and name.startswith("nvmlDeviceGetMemoryInfo") and not self.v2:
            raise AttributeError(name)  # an older driver's library
        return getattr(self, "_" + name)

    @staticmethod
    def _out(ref):
        return ref._obj  # what ctypes.byref() points at

    def _nvmlInit_v2(self):
        return 0

    def _nvmlShutdown(self):
        self.shut = True
        return 0

    def _nvmlSystemGetCudaDriverVersion_v2(self, ref):
        self._out(ref).value = self.driver_cuda
        return 0

    def _nvmlDeviceGetCount_v2(self, ref):
        self._out(ref).value = len(self.gpus)
        return 0

    def _nvmlDeviceGetHandleByIndex_v2(self, index, ref):
        self._out(ref).value = index.value + 1  # a handle is an opaque non-null pointer
        return 0

    def _gpu(self, handle):
        return self.gpus[handle.value - 1]

    def _nvmlDeviceGetName(self, handle, buf, length):
        buf.value = self._gpu(handle)[0].encode()[: length.value - 1]
        return 0

    def _nvmlDeviceGetMemoryInfo(self, handle, ref):
        self._out(ref).total = self._gpu(handle)[2]
        return 0

    def _nvmlDeviceGetMemoryInfo_v2(self, handle, ref):
        memory = self._out(ref)
        if memory.version != ctypes.sizeof(memory) | 2 << 24:
            return 3  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        memory.total, memory.reserved = self._gpu(handle)[2:4]
        return 0

    def _nvmlDeviceGetMigMode(self, handle, current, pending):
        if self.mig is None:
            return 3  # NVML_ERROR_NOT_SUPPORTED: a GPU without MIG
        self._out(current).value = self._out(pending).value = self.mig[handle.value - 1]
        return 0

    def _nvmlDeviceGetCudaComputeCapability(self, handle, major, minor):
        self._out(major).value, self._out(minor).value = self._gpu(handle)[1]
        return 0


@pytest.mark.parametrize("value,count,expected", [
    (None, 3, [0, 1, 2]),
    ("1,0", 2, [1, 0]),
    (" 1 , 0 ", 2, [1, 0]),
    ("0,7,1", 2, [0]),  # CUDA stops at the first index that does not exist
    ("1,x,0", 2, [1]),
    ("0,0,1", 2, [0]),
    ("", 2, []),
    ("-1", 2, []),
    ("GPU-8f3a1c2e-0000", 2, None),  # UUIDs are left to torch
    ("0,MIG-1", 2, None),
])
def test_visible_indices_follow_cuda_visible_devices(value, count, expected):
    assert nvml.visible_indices(value, count) == expected


def test_query_names_each_visible_gpu_in_cudas_order_and_shuts_nvml_down():
    lib = FakeNvml([H100, H100, H100])
    driver = nvml.query(lib, {"CUDA_VISIBLE_DEVICES": "2,0"})
    assert driver == nvml.Driver((13, 0), (nvml.Gpu(H100[0], "sm_90", H100_CUDA_MEMORY),) * 2)
    assert lib.shut


def test_memory_is_what_cuda_reports_and_nvmls_total_on_an_older_driver():
    assert nvml.query(FakeNvml([H100], v2=False), {}).gpus[0].memory == H100[2]
    assert nvml.query(FakeNvml([H100], fail="nvmlDeviceGetMemoryInfo_v2"), {}).gpus[0].memory == H100[2]


def test_query_reads_the_drivers_cuda_version():
    assert nvml.query(FakeNvml([H100], driver_cuda=12080), {}).cuda == (12, 8)


def test_mixed_models_are_left_to_torch():
    """CUDA orders the fastest first by default, NVML by PCI bus: which one is GPU 0 is not knowable here."""
    assert nvml.query(FakeNvml([A100, H100]), {}) is None
    assert nvml.query(FakeNvml([A100, H100]), {"CUDA_VISIBLE_DEVICES": "1"}).gpus[0].name == H100[0]


def test_a_gpu_in_mig_mode_is_left_to_torch():
    """CUDA sees MIG instances (a slice of the memory, their own names), not the GPU NVML names."""
    assert nvml.query(FakeNvml([H100, H100], mig=[0, 1]), {}) is None
    assert nvml.query(FakeNvml([H100, H100], mig=[0, 1]), {"CUDA_VISIBLE_DEVICES": "0"}).gpus[0].name == H100[0]
    assert len(nvml.query(FakeNvml([H100, H100], mig=[0, 0]), {}).gpus) == 2


def test_a_failing_call_is_no_answer_and_still_shuts_down(monkeypatch):
    lib = FakeNvml([H100], fail="nvmlDeviceGetCudaComputeCapability")
    monkeypatch.setattr(ctypes, "CDLL", lambda name: lib)
    assert nvml.visible_gpus({}) is None
    assert lib.shut


def test_no_driver_library_is_no_answer():
    assert nvml.visible_gpus({}, library="libpopkit-no-such-nvml.so.1") is None


# ------------------------------------------------------------------------------ system.probe on top of it


def interpreter(tmp_path, facts: str):
    """A stand-in interpreter that answers the facts script with `facts` (and fails the torch-import script)."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\ncase \"$2\" in *find_spec*) echo '{facts}';; *) exit 7;; esac\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


CUDA_TORCH = '{"python": "3.12.3", "platform": "Linux", "torch": "2.11.0+cu130", "cuda": "13.0", "hip": null}'


@pytest.fixture
def gpu_node(monkeypatch):
    monkeypatch.setattr(system, "gpu_devices_visible", lambda env=None: True)


def test_probe_takes_the_gpu_from_the_driver_without_importing_torch(tmp_path, monkeypatch, gpu_node):
    monkeypatch.setattr(nvml, "visible_gpus", lambda env: nvml.query(FakeNvml([H100, H100]), env))
    info = system.probe(interpreter(tmp_path, CUDA_TORCH), env={"CUDA_VISIBLE_DEVICES": "1"})
    assert info == {"python": "3.12.3", "platform": "Linux", "torch": "2.11.0+cu130", "cuda": "13.0", "hip": None,
                    "device": H100[0], "arch": "sm_90", "gpu_count": 1, "memory": H100_CUDA_MEMORY}


@pytest.mark.parametrize("facts,driver", [
    (CUDA_TORCH, nvml.Driver((12, 8), (nvml.Gpu(H100[0], "sm_90", H100_CUDA_MEMORY),))),  # driver older than torch's CUDA
    (CUDA_TORCH, None),  # NVML cannot answer
    ('{"python": "3.12.3", "platform": "Linux", "torch": "2.11.0", "cuda": null, "hip": "6.3"}', None),  # ROCm
    ('{"python": "3.12.3", "platform": "Linux", "torch": null, "cuda": null, "hip": null}', None),  # no torch
])
def test_probe_asks_torch_where_the_driver_cannot_answer_as_torch_would(tmp_path, monkeypatch, gpu_node,
                                                                         facts, driver):
    monkeypatch.setattr(nvml, "visible_gpus", lambda env: driver)
    info = system.probe(interpreter(tmp_path, facts), timeout=5)
    assert info["error"].endswith("exited with code 7: no output")  # the torch-import script ran (and failed)


def test_a_cpu_build_of_torch_sees_no_gpu(tmp_path, monkeypatch, gpu_node):
    monkeypatch.setattr(nvml, "visible_gpus", lambda env: pytest.fail("NVML asked for a CPU build of torch"))
    info = system.probe(interpreter(tmp_path, CUDA_TORCH.replace('"13.0"', "null")))
    assert (info["device"], info["gpu_count"], info["torch"]) == ("cpu", 0, "2.11.0+cu130")


def test_hidden_gpus_are_none_without_asking_the_driver(tmp_path, monkeypatch):
    monkeypatch.setattr(nvml, "visible_gpus", lambda env: pytest.fail("NVML asked with every GPU hidden"))
    info = system.probe(interpreter(tmp_path, CUDA_TORCH), env={"CUDA_VISIBLE_DEVICES": ""})
    assert (info["device"], info["gpu_count"], info.get("error")) == ("cpu", 0, None)


def test_this_interpreter_is_probed_here_as_its_facts_script_would_say(monkeypatch):
    """Where the eval runs popkit's own interpreter with its path settings, the facts come from this process
    (no Python start-up beside the run), equal to what the script prints in a child of that interpreter."""
    env = dict(os.environ)
    done = subprocess.run([sys.executable, "-c", system._FACTS_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=60)
    assert system.answers_here(sys.executable, env)
    assert system.facts_here() == json.loads(done.stdout.strip().splitlines()[-1])

    def no_process(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(system.subprocess, "run", no_process)
    monkeypatch.setattr(system, "gpu_devices_visible", lambda env=None: False)
    info = system.probe(sys.executable, env=env)
    assert {k: info[k] for k in ("python", "torch", "cuda", "device")} == {
        "python": "%d.%d.%d" % sys.version_info[:3], "torch": system.facts_here()["torch"],
        "cuda": system.facts_here()["cuda"], "device": "cpu"}
    assert not system.answers_here(sys.executable, {**env, "PYTHONPATH": "/elsewhere"})


def test_the_sandboxs_no_user_site_is_answered_here_unless_this_process_uses_a_user_site(monkeypatch):
    """The sandbox's environment sets PYTHONNOUSERSITE (its HOME is empty): the same packages are found when this
    process's path holds no user site, so nothing is started before a run; with a user site on the path, not."""
    import site

    env = {k: v for k, v in os.environ.items() if k != "PYTHONNOUSERSITE"} | {"PYTHONNOUSERSITE": "1"}
    monkeypatch.delenv("PYTHONNOUSERSITE", raising=False)
    user = "/home/someone/.local/lib/python3/site-packages"
    monkeypatch.setattr(site, "ENABLE_USER_SITE", True)
    monkeypatch.setattr(site, "getusersitepackages", lambda: user)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != user])
    assert system.answers_here(sys.executable, env)
    monkeypatch.setattr(sys, "path", [*sys.path, user])
    assert not system.answers_here(sys.executable, env)


class ClockedNvml(FakeNvml):
    """FakeNvml that also reports clocks, temperature, power and clock-event reasons, one reading after another."""

    def __init__(self, readings, **kwargs):
        super().__init__([H100], **kwargs)
        self.readings, self.read = readings, 0

    def _now(self):
        return self.readings[min(self.read, len(self.readings) - 1)]

    def _nvmlDeviceGetClockInfo(self, handle, kind, ref):
        self._out(ref).value = self._now()[0] if kind.value == 1 else self._now()[1]
        return 0

    def _nvmlDeviceGetTemperature(self, handle, sensor, ref):
        self._out(ref).value = self._now()[2]
        return 0

    def _nvmlDeviceGetPowerUsage(self, handle, ref):
        self._out(ref).value = self._now()[3]
        self.read += 1  # the last query of a reading (nvml.read asks the reasons first)
        return 0

    def _nvmlDeviceGetCurrentClocksEventReasons(self, handle, ref):
        self._out(ref).value = self._now()[4]
        return 0


def test_the_sampler_summarizes_clocks_temperature_power_and_throttling():
    from popkit.machine import gpustate

    readings = [(345, 2619, 35, 70_000, 0x1), (1980, 2619, 44, 310_500, 0x0), (1755, 2619, 47, 350_000, 0x4 | 0x20)]
    lib = ClockedNvml(readings)
    with gpustate.Sampler({}, load=lambda: lib, interval_s=0.001) as watch:
        while lib.read < 3:
            pass
    state = watch.state
    assert (state.sm_mhz, state.sm_mhz_low, state.mem_mhz, state.temp_c, state.power_w) == (1980, 345, 2619, 47, 350.0)
    assert state.throttle == ("sw_thermal", "sw_power_cap") and state.samples >= 3 and lib.shut
    assert gpustate.GpuState.from_json(state.to_json()) == state
    assert nvml.read(lib, nvml.handle(lib, 0)).sm_mhz == 1755
    with gpustate.Sampler({"CUDA_VISIBLE_DEVICES": "GPU-1234"}, load=lambda: ClockedNvml(readings)) as unmapped:
        pass
    assert unmapped.state is None  # a UUID: not sampled rather than the wrong GPU

    def no_driver():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    with gpustate.Sampler({}, load=no_driver) as none:
        pass
    assert none.state is None
