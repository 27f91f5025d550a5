"""bench/bench_fidelity.py's parts: replaying silicon rows (rows.py), scoring replays and profiles (scores.py), and
the result and replays files (files.py)."""
