"""An AMD GPU's state from the amdgpu driver's sysfs files, on a tree laid out as the driver lays it out."""

from popkit.machine import amdgpu, gpustate


def _card(root, n, vendor="0x1002", sclk="0: 500Mhz\n1: 2100Mhz *\n", mclk="0: 96Mhz\n1: 1300Mhz *\n",
          temps=(45000, 61000), power=("power1_average", 287000000)):
    device = root / f"card{n}" / "device"
    hwmon = device / "hwmon" / "hwmon3"
    hwmon.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "pp_dpm_sclk").write_text(sclk)
    (device / "pp_dpm_mclk").write_text(mclk)
    for i, t in enumerate(temps, 1):
        (hwmon / f"temp{i}_input").write_text(f"{t}\n")
    (hwmon / power[0]).write_text(f"{power[1]}\n")
    (root / f"card{n}-DP-1").mkdir()  # a connector, not a card
    return device


def test_a_reading_has_the_starred_clocks_the_hottest_sensor_and_the_power(tmp_path):
    device = _card(tmp_path, 0)
    assert amdgpu.read(device) == amdgpu.Reading(sm_mhz=2100, mem_mhz=1300, temp_c=61, power_w=287.0, reasons=0)


def test_power_input_stands_in_for_power_average(tmp_path):
    device = _card(tmp_path, 0, power=("power1_input", 150500000))
    assert amdgpu.read(device).power_w == 150.5


def test_missing_files_read_zero(tmp_path):
    device = tmp_path / "card0" / "device"
    device.mkdir(parents=True)
    assert amdgpu.read(device) == amdgpu.Reading(0, 0, 0, 0.0, 0)


def test_the_visible_card_is_the_entry_among_amd_cards_in_driver_order(tmp_path):
    _card(tmp_path, 0, vendor="0x10de")  # an NVIDIA card beside them is not counted
    first, second = _card(tmp_path, 1), _card(tmp_path, 2)
    assert amdgpu.cards(tmp_path) == [first, second]
    assert amdgpu.visible_card({}, tmp_path) == first
    assert amdgpu.visible_card({"HIP_VISIBLE_DEVICES": "1,0"}, tmp_path) == second
    assert amdgpu.visible_card({"ROCR_VISIBLE_DEVICES": "1"}, tmp_path) == second
    assert amdgpu.visible_card({"HIP_VISIBLE_DEVICES": "GPU-abc"}, tmp_path) is None  # not mapped: no reading
    assert amdgpu.visible_card({"HIP_VISIBLE_DEVICES": "5"}, tmp_path) is None


def test_the_sampler_reads_an_amd_gpu_where_nvml_is_absent(tmp_path):
    _card(tmp_path, 0, temps=(52000,))

    def no_driver():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    with gpustate.Sampler({}, load=no_driver, interval_s=0.001, amd_root=tmp_path) as watch:
        pass
    state = watch.state
    assert (state.sm_mhz, state.mem_mhz, state.temp_c, state.power_w, state.throttle) == (2100, 1300, 52, 287.0, ())


def test_no_amd_card_no_state(tmp_path):
    def no_driver():
        raise OSError("no NVML")

    with gpustate.Sampler({}, load=no_driver, amd_root=tmp_path) as watch:
        pass
    assert watch.state is None
