"""An AMD GPU's clocks, temperature and power, from the amdgpu driver's sysfs files (no ROCm library, no tool).

The kernel driver publishes them as text under /sys/class/drm/cardN/device (docs.kernel.org, "amdgpu"):
- `pp_dpm_sclk` / `pp_dpm_mclk`: the SM (graphics) and memory clock levels, one per line (`1: 1700Mhz *`),
  the current one starred;
- `hwmon/hwmon*/temp*_input` (millidegrees Celsius: edge, junction, memory) and `power1_average` or
  `power1_input` (microwatts).
amd-smi and rocm-smi read the same driver; reading the files costs no process start per sample. What the
driver does not publish as text (throttle reasons live only in the binary `gpu_metrics` table, whose layout
changes between versions) is not read: an AMD reading carries no throttle reasons.

The card a HIP program sees first is the HIP_VISIBLE_DEVICES (or ROCR_VISIBLE_DEVICES) entry's index among
the AMD cards in the driver's order; UUID forms are not mapped (no reading then).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from popkit.machine.nvml import Reading

SYSFS = Path("/sys/class/drm")
AMD_VENDOR = "0x1002"
_LEVEL = re.compile(r"^\s*\d+:\s*(\d+)\s*mhz\s*\*\s*$", re.IGNORECASE)


def cards(root: Path = SYSFS) -> list[Path]:
    """The AMD cards' device folders, in the driver's order (card0, card1, ...)."""
    found = []
    for card in root.glob("card*"):
        if not re.fullmatch(r"card\d+", card.name):
            continue  # connectors: card0-DP-1
        if _text(card / "device" / "vendor") == AMD_VENDOR:
            found.append((int(card.name[4:]), card / "device"))
    return [device for _, device in sorted(found)]


def visible_card(env: Mapping[str, str], root: Path = SYSFS) -> Path | None:
    """The device folder of the first AMD GPU a process under `env` sees; None where there is none or it is
    named in a form not mapped here."""
    found = cards(root)
    raw = env.get("HIP_VISIBLE_DEVICES") or env.get("ROCR_VISIBLE_DEVICES") or ""
    first = raw.split(",")[0].strip() if raw.strip() else "0"
    if not first.isdigit() or int(first) >= len(found):
        return None
    return found[int(first)]


def _text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _current_mhz(path: Path) -> int:
    for line in _text(path).splitlines():
        match = _LEVEL.match(line)
        if match:
            return int(match.group(1))
    return 0


def _number(path: Path) -> int:
    text = _text(path)
    return int(text) if text.isdigit() else 0


def read(device: Path) -> Reading:
    """The state of the card at `device` now; a quantity the driver does not publish reads 0."""
    hwmons = sorted((device / "hwmon").glob("hwmon*"))
    hwmon = hwmons[0] if hwmons else device / "hwmon" / "none"
    temps = [_number(p) for p in hwmon.glob("temp*_input")]
    power = _number(hwmon / "power1_average") or _number(hwmon / "power1_input")
    return Reading(sm_mhz=_current_mhz(device / "pp_dpm_sclk"), mem_mhz=_current_mhz(device / "pp_dpm_mclk"),
                   temp_c=max(temps, default=0) // 1000, power_w=power / 1e6, reasons=0)


__all__ = ["cards", "visible_card", "read", "SYSFS"]
