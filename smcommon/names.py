"""Names shared by the entry point, the model, the launcher and the benchmarks.

This module imports nothing, so any package may import it without pulling in another one:
`model` reads the backend the entry point chose, `launch` sets the job's secret, `bench` finds
the entry point's log lines, and none of them imports the entry point's planning code for that.
"""

# --------------------------------------------------------------------------------------------
# Environment variables

# The launcher's per-job random secret, from which every host derives the job's ssh keys and the
# coordination channel's key; never forwarded to ranks, never logged.
JOB_SECRET_ENV = "SM_HVD_JOB_SECRET"  # noqa: S105 - a variable name, not a secret
# Its earlier name, still accepted (it keyed only ssh when it was named).
OLD_JOB_SECRET_ENV = "SM_HVD_SSH_SEED"  # noqa: S105 - a variable name
# Tells the built-in model which backend runs it (model/backend.py); a backend value below.
BACKEND_ENV = "SM_HVD_BACKEND"
# Where the SageMaker contract lives (tests point it elsewhere); /opt/ml by default.
ML_ROOT_ENV = "SM_HVD_ML_ROOT"

# --------------------------------------------------------------------------------------------
# Backend values (entrypoint.contract.Backend's values; BACKEND_ENV carries one of them)

MPI_BACKEND = "mpi"
PER_HOST_BACKEND = "per_host"
MULTI_WORKER_MIRRORED_BACKEND = "multi_worker_mirrored"
PARAMETER_SERVER_BACKEND = "parameter_server"
TORCH_DISTRIBUTED_BACKEND = "torch_distributed"

# --------------------------------------------------------------------------------------------
# Exit codes

# What a stopped job (SIGTERM) exits with on every host, and what a process killed by SIGTERM
# exits with: 128 + SIGTERM (15), as a shell reports it.
STOPPED_EXIT_CODE = 143

# --------------------------------------------------------------------------------------------
# Log lines that tools read (bench/scale.py): the text before the number.

# Every host's last line: "exiting with code N".
EXIT_LINE = "exiting with code"
# The master's, at the end of a multi-host job: "longest silence of a live worker: S s".
WORKER_SILENCE_LINE = "longest silence of a live worker"
# A worker's, at its end: "longest silence of the master: S s".
MASTER_SILENCE_LINE = "longest silence of the master"

# --------------------------------------------------------------------------------------------
# Program checks: what the entry point runs before any process starts, registered by the
# packages that know the program (pyproject.toml's entry points), so the entry point imports none
# of them. Each is `check(hyperparameters, env) -> str | None`: None, or the one-line error.

PROGRAM_CHECKS_GROUP = "sm_horovod.program_checks"
# Every job: an s3:// model_dir on a bucket that does not exist (tf_s3).
MODEL_DIR_CHECK = "model_dir"
# The built-in model only: its hyperparameters, with the model's own parser (model.hparams).
BUILTIN_PROGRAM_CHECK = "builtin_program"
# The TensorFlow estimator's hyperparameter, passed to scripts as --model_dir.
MODEL_DIR_PARAM = "model_dir"
