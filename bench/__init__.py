"""Benchmarks: each module is runnable with ``python -m bench.<name> [--quick]``."""
