"""`train`: what SageMaker runs in every container of the job (`docker run IMAGE train`).

Reads and checks the whole contract before starting any process, so bad input fails in
seconds with one line in /opt/ml/output/failure; then hands over to `supervise`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from entrypoint import sshkeys, supervise
from entrypoint.contract import (
    BuiltinProgram,
    Contract,
    ContractError,
    ContractPaths,
    UserScript,
    read_contract,
)
from entrypoint.failure import Reason, format_failure, record_failure
from entrypoint.plan import (
    JobPlan,
    build_mpirun_argv,
    format_command,
    make_plan,
    rank_environment,
    require_channel,
    sagemaker_environment,
)
from model.hparams import parse_hyperparameters

log = logging.getLogger("entrypoint")


def configure_logging(host: str, role: str) -> None:
    """Logs go to stdout (SageMaker ships stdout to CloudWatch), host and role on every line."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter(
            f"%(asctime)s %(levelname)s host={host} role={role} entrypoint: %(message)s"
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def _validate_builtin_program(contract: Contract) -> None:
    """The built-in model's checks, before any process starts: its `train` channel and its
    hyperparameters (with the model's own parser)."""
    paths = contract.paths
    train_dir = paths.data_dir / "train"
    require_channel(contract, "train", channel_dir_exists=train_dir.is_dir())
    try:
        parse_hyperparameters(contract.program_hyperparameters)
    except ValueError as error:
        raise ContractError(f"{paths.hyperparameters}: {error}") from None


def _prepare_user_code(program: UserScript, paths: ContractPaths) -> None:
    """Script mode: every host fetches the user's code before it serves ssh, so a worker that
    answers the master is a worker that can run the script."""
    # Imported here, not at the top: it pulls in boto3, a fifth of the entry point's start-up,
    # and only script mode needs it.
    from sagemaker_training import files  # noqa: PLC0415

    if program.submit_dir != str(paths.code_dir):
        log.info("fetching the user's code from %s", program.submit_dir)
        try:
            files.download_and_extract(program.submit_dir, str(paths.code_dir))
        except Exception as error:  # noqa: BLE001 - boto3/tarfile/OS errors all mean the same
            raise ContractError(
                f"sagemaker_submit_directory {program.submit_dir}: cannot fetch ({error})"
            ) from None
    script = paths.code_dir / program.program
    if not script.is_file():
        raise ContractError(
            f"sagemaker_program {program.program}: no such file in {paths.code_dir}"
        )


def _install_ssh_keys(env: Mapping[str, str]) -> None:
    seed = sshkeys.choose_seed(env)
    if seed is None:
        raise ContractError(
            f"no job identity for ssh: set {sshkeys.SeedSource.LAUNCHER_SECRET.value} "
            "(the launcher does) or TRAINING_JOB_NAME (SageMaker does)"
        )
    source, material = seed
    if source.is_weak:
        log.warning(
            "ssh keys derived from %s, which anyone who can describe the job can read; "
            "launch with a per-job %s secret for real isolation",
            source.value,
            sshkeys.SeedSource.LAUNCHER_SECRET.value,
        )
    keys = sshkeys.derive_keys(material)
    sshkeys.install_keys(keys)
    log.info("ssh keys installed (user key %s)", sshkeys.fingerprint(keys.user_public))


def run(env: Mapping[str, str], paths: ContractPaths) -> int:
    contract = read_contract(paths, env)
    role = "master" if contract.current_host == contract.master_host else "worker"
    configure_logging(contract.current_host, role)
    log.info(
        "job %s: hosts %s, interface %s",
        contract.job_name or "(unnamed)",
        ",".join(contract.hosts),
        contract.network_interface_name,
    )
    if isinstance(contract.program, BuiltinProgram):
        _validate_builtin_program(contract)
    gpu_count = supervise.detect_gpu_count()
    plan: JobPlan = make_plan(contract, gpu_count=gpu_count)
    if isinstance(contract.program, UserScript):
        _prepare_user_code(contract.program, paths)
    if plan.is_multi_host:
        _install_ssh_keys(env)

    stop = threading.Event()
    supervise.install_stop_handlers(stop)
    config = supervise.ShellConfig(
        output_dir=paths.output_dir,
        host_wait_timeout_s=contract.host_wait_timeout_s,
        sigterm_grace_s=contract.sigterm_grace_s,
    )
    if not plan.is_master:
        return supervise.run_worker(plan, config, stop)
    sm_env = sagemaker_environment(contract, gpu_count=gpu_count, cpu_count=os.cpu_count() or 1)
    mpirun_env = rank_environment(env, sm_env, plan)
    argv = build_mpirun_argv(plan, mpirun_env)
    return supervise.run_master(
        plan,
        mpirun_argv=argv,
        mpirun_env=mpirun_env,
        config=config,
        stop=stop,
        command_for_log=format_command(argv),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args:
        print(f"usage: train (no arguments; got {' '.join(args)})", file=sys.stderr)
        return 64
    env = dict(os.environ)
    paths = ContractPaths(Path(env.get("SM_HVD_ML_ROOT", "/opt/ml")))
    configure_logging(env.get("SM_CURRENT_HOST", "?"), "starting")
    try:
        return run(env, paths)
    except ContractError as error:
        log.error("%s", format_failure(Reason.BAD_INPUT, str(error)))
        record_failure(paths.output_dir, Reason.BAD_INPUT, str(error))
        return 1
    except Exception as error:
        log.exception("entry point failed")
        record_failure(paths.output_dir, Reason.INTERNAL, f"{type(error).__name__}: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
