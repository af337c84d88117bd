"""Measurement: profiling real training steps, the corpus of configurations to measure,
collecting and featurising rows, and single-operation benchmarks.

Built on :mod:`costaware.core` and :mod:`costaware.zoo`; knows nothing of a study's
runtime, of reports or of the HPO frameworks."""
