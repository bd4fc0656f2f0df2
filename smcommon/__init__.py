"""What the entry point, the built-in model, serve, the launcher and the benchmarks share.

Dependency-free (the standard library only) and importing none of those packages, so imports
run one way: `entrypoint`, `model` and `serve` each import this, never each other's internals.
- `names`: environment variables, backend values, exit codes, log lines that tools read;
- `failure`: a failure as a value and the failure file (/opt/ml/output/failure);
- `pipoutput`: what pip's output says went wrong (script mode and serve's requirements.txt);
- `checkpoint`, `heartbeat`: for user scripts too (shipped in the image): checkpoints a restart
  can trust, and a rank's "still progressing".
"""
