"""SageMaker-like clusters on one Docker engine, and the digits data set: what the tests and
the benchmarks both use (so neither imports the other)."""
