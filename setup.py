"""The package list, which setup.cfg cannot spell: the code packages that exist, plus the two data
packages that setup.cfg's package_dir maps onto the top-level kernels/ and golden/ folders."""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["qwen38gen", "qwen38gen.*"])
      + ["qwen38gen._kernels", "qwen38gen._golden"])
