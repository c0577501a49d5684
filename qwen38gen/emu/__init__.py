"""The emitted program's schedule executed in numpy on the CPU: the ops (ops.py), the executor
(schedule.py) and the engine's backend on it (backend.py)."""
