"""Serving: requests (requests.py), the continuous-batching engine (engine.py), the backends it
drives (backends.py), and what `qwen38gen run` puts together from them (run.py)."""
