"""Verification: golden single-sequence runs (golden.py), the checks and locks behind
`qwen38gen check` (check.py, serve_lock.py), and the speculative decoding loop that
`check --mtp` drives on an mtp program (spec_runtime.py)."""
