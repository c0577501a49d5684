"""Where the package's data lives: the kernel headers (kernels/), the golden runs (golden/) and
the timing model's calibration run (one bench/ file).

Both folders sit at the top of the checkout. A wheel carries them as package data, mapped in
setup.cfg to ``qwen38gen/_kernels``, ``qwen38gen/_golden`` and ``qwen38gen/_bench``; a checkout or an editable install
reads them where they are. The installed copy wins where both exist. They are real folders
either way (nvcc takes an include folder): pip installs a wheel unpacked.
"""

from __future__ import annotations

from pathlib import Path

from .errors import UserError

_PACKAGE = Path(__file__).resolve().parent


def _data_dir(installed: str, checkout: str, pattern: str) -> Path:
    """The first of qwen38gen/INSTALLED and CHECKOUT/ beside the package holding PATTERN."""
    places = (_PACKAGE / installed, _PACKAGE.parent / checkout)
    for d in places:
        if d.is_dir() and any(d.glob(pattern)):
            return d
    raise UserError(f"qwen38gen's {checkout}/ folder is missing (no {pattern} in "
                    f"{' nor '.join(map(str, places))}); reinstall qwen38gen (pip install .) "
                    "or use a complete checkout")


def kernels_dir() -> Path:
    """The folder of the kernel headers (kernels/*.cuh) that emitted programs inline."""
    return _data_dir("_kernels", "kernels", "*.cuh")


def golden_dir() -> Path:
    """The folder of the committed golden runs (golden/*.json)."""
    return _data_dir("_golden", "golden", "*.json")


CALIBRATION_RUN = "2026-12-04-h200-v20.json"


def calibration_file() -> Path:
    """The committed bench run the timing model (`qwen38gen perf`) is calibrated on."""
    return _data_dir("_bench", "bench", CALIBRATION_RUN) / CALIBRATION_RUN
