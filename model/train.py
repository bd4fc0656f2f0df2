"""`python -m model.train --name value ...`: the built-in training program, on every rank.

Exit codes: 0 trained and exported; 1 failed (the reason is in `<output dir>/failure`);
143 stopped by SIGTERM after the checkpoint was written.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from model.backend import LEGACY_KERAS_ENV, backend_name, legacy_keras_setting
from model.checkpoints import DiskFullError
from model.hparams import HyperparameterError, parse_argv, parse_hyperparameters
from model.images import DataError
from model.paths import paths_from_env
from model.stopping import StopRequest
from smcommon.failure import Failure, Reason, record_failure

log = logging.getLogger("model.train")

FAILED_EXIT_CODE = 1
# Set before TensorFlow is imported: it reads them once, at import.
_QUIET_TENSORFLOW = {"TF_CPP_MIN_LOG_LEVEL": "2"}
# Where launchers put the rank before Horovod is initialised (OpenMPI, Horovod's Gloo).
_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMIX_RANK")


def log_format(host: str, rank: int | str) -> str:
    return f"%(asctime)s host={host} rank={rank} %(levelname)s %(message)s"


def configure_logging(host: str, rank: int | str) -> None:
    # stdout: the per-epoch metrics line is read from it (mpirun tags it `<stdout>`).
    logging.basicConfig(
        level=logging.INFO, format=log_format(host, rank), stream=sys.stdout, force=True
    )


def host_name(env: Mapping[str, str]) -> str:
    return env.get("SM_CURRENT_HOST") or socket.gethostname()


def launcher_rank(env: Mapping[str, str]) -> str:
    """The rank as the launcher told it, for log lines written before Horovod starts."""
    return next((env[name] for name in _RANK_VARIABLES if env.get(name)), "0")


def _fail(output_dir: Path, reason: Reason, message: str, host: str | None = None) -> int:
    log.error("%s: %s", reason.value, message)
    record_failure(output_dir, Failure(reason, message, host))
    return FAILED_EXIT_CODE


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    # First of all, so a stop during TensorFlow's import is not lost.
    stop = StopRequest()
    stop.install()
    env = os.environ if env is None else env
    for name, value in _QUIET_TENSORFLOW.items():
        os.environ.setdefault(name, value)
    legacy_keras = legacy_keras_setting(
        env, tf_keras_installed=importlib.util.find_spec("tf_keras") is not None
    )
    if legacy_keras is not None:
        os.environ[LEGACY_KERAS_ENV] = legacy_keras
    host = host_name(env)
    configure_logging(host, launcher_rank(env))
    paths = paths_from_env(env)
    try:
        params = parse_hyperparameters(parse_argv(sys.argv[1:] if argv is None else argv))
    except HyperparameterError as error:
        return _fail(paths.output_dir, Reason.BAD_INPUT, str(error))

    # Imported only now: TensorFlow takes seconds to import and is not needed above.
    import tensorflow as tf  # noqa: PLC0415

    from model import training  # noqa: PLC0415
    from model.backend import collective  # noqa: PLC0415

    tf.get_logger().setLevel(logging.ERROR)
    # SavedModel export and Keras report through absl: notes about renamed inputs and such.
    logging.getLogger("absl").setLevel(logging.WARNING)
    collective.init()
    # Again: under MultiWorkerMirroredStrategy, TensorFlow's runtime installs its own SIGTERM
    # handler (its preemption notifier, which only notes the time), replacing ours.
    stop.install()
    configure_logging(host, collective.rank())
    if collective.rank() == 0:
        log.info("backend %s, %d rank(s)", backend_name(env), collective.size())
    try:
        return training.run(params, paths, stop, host)
    except DataError as error:
        return _fail(paths.output_dir, Reason.BAD_DATA, str(error))
    except training.CheckpointMismatchError as error:
        return _fail(paths.output_dir, Reason.BAD_INPUT, str(error))
    except DiskFullError as error:
        return _fail(paths.output_dir, Reason.DISK_FULL, str(error), host)
    # Anything else is a bug or an environment problem: one traceback, one failure line.
    except Exception as error:
        log.exception("training failed")
        record_failure(
            paths.output_dir, Failure(Reason.TRAINING_FAILED, f"{type(error).__name__}: {error}")
        )
        return FAILED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
