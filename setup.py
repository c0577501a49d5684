"""The package list, which setup.cfg cannot spell: the code packages that exist, plus the three
data packages that setup.cfg's package_dir maps onto the top-level kernels/, golden/ and bench/
folders (of bench/, only the timing model's calibration run ships)."""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["qwen38gen", "qwen38gen.*"])
      + ["qwen38gen._kernels", "qwen38gen._golden", "qwen38gen._bench"])
