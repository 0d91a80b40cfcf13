"""Benchmarks: throughput and latency measured side by side in one run, reported as ratios."""
