"""`train`: what SageMaker runs in every container of the job (`docker run IMAGE train`).

Reads and checks the whole contract before starting any process, so bad input fails in
seconds with one line in /opt/ml/output/failure; then read -> plan -> prepare -> supervise:
`contract` reads, `plan` decides (the Launch), `prepare` readies this host (`usercode`, keys),
`supervise` runs this host's part of the job.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from entrypoint import supervise
from entrypoint.channel import protocol
from entrypoint.contract import (
    MPI_CUSTOM_OPTIONS_PARAM,
    BuiltinProgram,
    Contract,
    ContractError,
    ContractPaths,
    UserScript,
    read_contract,
)
from entrypoint.groups import describe_roles
from entrypoint.host import job_progress, netif, probes, signals, sshkeys, usercode
from entrypoint.host.rank_output import DRAIN_S, LogHandler, OutputWriter
from entrypoint.job import format_command
from entrypoint.plan import JobPlan, launch_lines, make_plan, require_channel
from entrypoint.restarts import Progress, RestartPolicy
from smcommon.failure import STOPPED_EXIT_CODE, Failure, Reason, record_failure
from smcommon.names import (
    BUILTIN_PROGRAM_CHECK,
    EXIT_LINE,
    ML_ROOT_ENV,
    MODEL_DIR_CHECK,
    PROGRAM_CHECKS_GROUP,
)

log = logging.getLogger("entrypoint")


def configure_logging(
    host: str, role: str, level: int = logging.INFO, writer: OutputWriter | None = None
) -> None:
    """Logs go to stdout (SageMaker ships stdout to CloudWatch), host and role on every line;
    through `writer`, the one writer of stdout the ranks' lines go through too (else, as in
    tests that run pieces of the entry point, straight to sys.stdout)."""
    handler: logging.Handler = (
        logging.StreamHandler(sys.stdout) if writer is None else LogHandler(writer)
    )
    handler.setFormatter(
        logging.Formatter(
            f"%(asctime)s %(levelname)s host={host} role={role} entrypoint: %(message)s"
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


# A registered program check (smcommon/names.py): None, or the one-line error.
ProgramCheck = Callable[[Mapping[str, str], Mapping[str, str]], str | None]


def registered_checks(group: str = PROGRAM_CHECKS_GROUP) -> dict[str, ProgramCheck]:
    """The program checks this image's packages register (pyproject.toml's entry points): the
    built-in model's and tf_s3's in the TensorFlow images. The torch images install neither
    package (the registration is the project's, so it is there too): a check whose own package
    is absent is not run; any other import error is a bug and fails the job."""
    checks: dict[str, ProgramCheck] = {}
    for entry in importlib.metadata.entry_points(group=group):
        try:
            checks[entry.name] = entry.load()
        except ModuleNotFoundError as error:
            package = entry.module.partition(".")[0]
            if error.name != package:
                raise
            log.debug("program check %s: %s is not in this image", entry.name, package)
    return checks


def run_program_checks(
    contract: Contract, env: Mapping[str, str], checks: Mapping[str, ProgramCheck]
) -> None:
    """The checks that apply to this job's program, before any process starts: the built-in
    model's `train` channel and hyperparameters, and an s3:// model_dir's bucket."""
    names = [MODEL_DIR_CHECK]
    if isinstance(contract.program, BuiltinProgram):
        train_dir = contract.paths.data_dir / "train"
        require_channel(contract, "train", channel_dir_exists=train_dir.is_dir())
        names.append(BUILTIN_PROGRAM_CHECK)
    for name in names:
        check = checks.get(name)
        error = check(contract.program_hyperparameters, env) if check is not None else None
        if error:
            raise ContractError(
                f"{contract.paths.hyperparameters}: {error}"
                if name == BUILTIN_PROGRAM_CHECK
                else error
            )


def _job_seed(env: Mapping[str, str]) -> bytes:
    """The job's secret, from which the ssh keys and the channel key are derived."""
    seed = sshkeys.choose_seed(env)
    if seed is None:
        raise ContractError(
            f"no job identity for ssh: set {sshkeys.SeedSource.LAUNCHER_SECRET.value} "
            "(the launcher does) or TRAINING_JOB_NAME (SageMaker does)"
        )
    source, material = seed
    if source.is_weak:
        log.warning(
            "job keys derived from %s, which anyone who can describe the job can read; "
            "launch with a per-job %s secret for real isolation",
            source.value,
            sshkeys.SeedSource.LAUNCHER_SECRET.value,
        )
    return material


def _install_ssh_keys(seed: bytes) -> None:
    keys = sshkeys.derive_keys(seed)
    sshkeys.install_keys(keys)
    log.info("ssh keys installed (user key %s)", sshkeys.fingerprint(keys.user_public))


def _log_job(contract: Contract) -> None:
    log.info(
        "job %s: hosts %s, interface %s",
        contract.job_name or "(unnamed)",
        ",".join(contract.hosts),
        contract.network_interface_name,
    )
    if contract.settings.custom_mpi_options:
        log.info(
            "%s: appending to mpirun: %s",
            MPI_CUSTOM_OPTIONS_PARAM,
            format_command(list(contract.settings.custom_mpi_options)),
        )


def prepare(contract: Contract, plan: JobPlan, env: Mapping[str, str]) -> bytes | None:
    """What this host readies before any process of the job starts: the program's checks (or
    the user's code), and for a multi-host job its key for the channel (and the ssh keys where
    the launch runs sshd). Returns the channel's job key, None on one host."""
    run_program_checks(contract, env, registered_checks())
    if isinstance(contract.program, UserScript):
        usercode.prepare_user_code(contract.program, contract.paths)
    if not plan.is_multi_host:
        return None
    seed = _job_seed(env)
    if plan.launch.runs_sshd:
        _install_ssh_keys(seed)
    return protocol.derive_job_key(seed)


def run(env: Mapping[str, str], paths: ContractPaths, writer: OutputWriter | None = None) -> int:
    """Read the contract, plan the job, prepare this host, supervise its part (its output
    through `writer`)."""
    # Before anything slow (the user's code from S3, pip): a stop during set-up also leaves
    # its failure line, and the host exits at once.
    stop = threading.Event()
    handlers = signals.install_stop_handlers(stop)
    contract = read_contract(paths, env)
    role = "master" if contract.current_host == contract.master_host else "worker"
    configure_logging(contract.current_host, role, contract.settings.log_level, writer)
    if writer is not None:
        writer.name = f"host={contract.current_host} role={role} entrypoint"
    # The interface every backend is pinned to: the contract's, or a fallback where this host
    # has no such interface (SDK v3's local mode names `ethwe`).
    contract = dataclasses.replace(
        contract,
        network_interface_name=netif.usable_interface(
            contract.network_interface_name, contract.master_host
        ),
    )
    _log_job(contract)
    plan = make_plan(
        contract,
        gpu_count=probes.detect_gpu_count(),
        cpu_count=os.cpu_count() or 1,
        env=env,
    )
    if contract.is_hetero:
        log.info("instance groups: %s", describe_roles(contract, plan.roles))
    for line in launch_lines(plan):
        log.info("%s", line)
    try:
        with handlers.setting_up():
            job_key = prepare(contract, plan, env)
    except signals.SetupStopped as stopped:
        stopped.host = contract.current_host
        raise
    config = supervise.ShellConfig(
        output_dir=paths.output_dir,
        host_wait_timeout_s=contract.settings.host_wait_timeout_s,
        sigterm_grace_s=contract.settings.sigterm_grace_s,
        stall_timeout_s=contract.settings.stall_timeout_s,
        restarts=RestartPolicy(
            contract.settings.max_restarts, contract.settings.max_restarts_without_progress
        ),
        read_progress=_progress_reader(env, paths),
    )
    return supervise.run_host(plan, config, stop, job_key=job_key, output=writer)


def _progress_reader(env: Mapping[str, str], paths: ContractPaths) -> Callable[[], Progress]:
    """How far the job got on this host (restarts' no-progress guard): the checkpoint folder
    (SageMaker's, or SM_CHECKPOINT_DIR as the built-in model reads it) and the ranks' steps."""
    checkpoints = Path(env.get("SM_CHECKPOINT_DIR") or paths.ml_root / "checkpoints")
    try:
        job_progress.prepare(job_progress.PROGRESS_DIR)
    except OSError as error:
        log.warning("no folder for the ranks' steps (%s): checkpoints alone show progress", error)
        return functools.partial(job_progress.read_progress, checkpoints, None)
    return functools.partial(job_progress.read_progress, checkpoints, job_progress.PROGRESS_DIR)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args:
        print(f"usage: train (no arguments; got {' '.join(args)})", file=sys.stderr)
        return 64
    env = dict(os.environ)
    paths = ContractPaths(Path(env.get(ML_ROOT_ENV, "/opt/ml")))
    host = env.get("SM_CURRENT_HOST", "?")
    # The one writer of this container's stdout, from the first line to the last.
    writer = OutputWriter(1)
    configure_logging(host, "starting", writer=writer)
    code = _run_reporting_failures(env, paths, writer)
    # The last line of every host's log: when this host was done, and with what.
    log.info("%s %d", EXIT_LINE, code)
    # Written out (within a bound: a stdout that stopped taking bytes cannot hold the exit).
    writer.close(DRAIN_S)
    return code


def _run_reporting_failures(
    env: Mapping[str, str], paths: ContractPaths, writer: OutputWriter | None = None
) -> int:
    try:
        return run(env, paths, writer)
    except signals.SetupStopped as stopped:
        failure = Failure(
            Reason.STOPPED,
            f"stopped by {stopped.signal_name} during set-up",
            stopped.host,
        )
        log.error("%s", failure.line)
        record_failure(paths.output_dir, failure)
        return STOPPED_EXIT_CODE
    except ContractError as error:
        failure = Failure(Reason.BAD_INPUT, str(error))
        log.error("%s", failure.line)
        record_failure(paths.output_dir, failure)
        return 1
    except Exception as error:
        log.exception("entry point failed")
        record_failure(
            paths.output_dir, Failure(Reason.INTERNAL, f"{type(error).__name__}: {error}")
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
