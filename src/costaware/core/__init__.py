"""Prediction: the dry run (trace), its op counts (flops), the allocator simulation, the
analytic estimate, the features, the op-level time model and the learned cost model.

Knows nothing of measuring (:mod:`costaware.measure`), of a study's runtime
(:mod:`costaware.runtime`), of reports or of the HPO frameworks."""
