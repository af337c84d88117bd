"""Tests of the benchmark scripts under ``benchmarks/``."""
