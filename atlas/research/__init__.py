"""Every reported number: data sets and their loaders (`datasets`, `locomo`), Recall@K and leak
evaluation (`evaluate`, `metrics`, `leaks`, `consolidation_eval`), recorded results (`results`) and
benchmarks (`bench`)."""
