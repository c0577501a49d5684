"""The numpy references of single kernel ops, for the GPU tests: they live in the package
(qwen38gen/emu/ops.py), where the schedule emulator uses them too."""

from qwen38gen.emu.ops import *  # noqa: F401,F403
