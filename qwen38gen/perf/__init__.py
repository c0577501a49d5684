"""Performance: `bench` and `bench --mtp` (bench.py, bench_mtp.py), the engines compared with
(peers.py), the per-kernel trace (trace.py), kernel timing kinds (timing.py) and the timing
model of the decode step (perfmodel.py)."""
