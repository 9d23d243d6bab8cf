"""Benchmarks waiting to join ``benchmarks/`` (each runnable as ``python -m benchmarks_new.<name>``)."""
