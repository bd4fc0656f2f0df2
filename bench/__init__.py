"""Benchmarks: our entry point against the sagemaker-training toolkit's MPI runner and a bare
mpirun, on the same containers, in one run (`python -m bench`; `make bench`).

Every figure is measured by this package; `bench.report` turns the results into the JSON,
the Markdown tables and the plots in bench/results/, which docs/benchmarks.md discusses.
"""
