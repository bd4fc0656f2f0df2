"""Reading the contract: the config files and the environment into one `Contract`, or a
`ContractError` with one line naming the file or variable at fault. Pure but for
`read_contract`, which reads the files; the names, types and value helpers it builds on are the
package's (`entrypoint.contract`), the cluster, the launch choice and the entry point's own
settings are its sibling modules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from entrypoint import sdk3
from entrypoint.contract import (
    _CHANNEL_NAME,
    _HYPERPARAMETER_NAME,
    _INTERFACE_NAME,
    ENTRYPOINT_HYPERPARAMETERS,
    IMAGE_FLAVOR_ENV,
    JOB_NAME_PARAM,
    MODEL_DIR_PARAM,
    PROGRAM_PARAM,
    SAGEMAKER_PREFIX,
    SUBMIT_DIR_PARAM,
    TUNING_METRIC_PARAM,
    BuiltinProgram,
    Contract,
    ContractError,
    ContractPaths,
    Program,
    ShellCommand,
    UserScript,
    _load_json_object,
    decode_hyperparameter,
    hyperparameter_text,
)
from entrypoint.contract.cluster import (
    choose_distribution_group,
    parse_current_host,
    parse_hosts,
    parse_instance_groups,
)
from entrypoint.contract.distribution import (
    check_backend_fits,
    check_backend_in_image,
    check_distribution_in_image,
)
from entrypoint.contract.settings import parse_entrypoint_settings


def program_hyperparameters(
    hyperparameters: Mapping[str, Any], *, job_name: str | None = None
) -> dict[str, str]:
    """What the training program gets: all but the entry point's and the toolkit's own.

    As in AWS's TensorFlow containers, a tuning job's model_dir (an S3 prefix every training
    job of the tuning job shares) gets the job's name appended, so jobs do not overwrite each
    other's checkpoints."""
    program = {
        name: hyperparameter_text(value)
        for name, value in sorted(hyperparameters.items())
        if name not in ENTRYPOINT_HYPERPARAMETERS
        and name != TUNING_METRIC_PARAM
        and not name.startswith(SAGEMAKER_PREFIX)
    }
    model_dir = program.get(MODEL_DIR_PARAM)
    if (
        TUNING_METRIC_PARAM in hyperparameters
        and model_dir
        and job_name
        and not model_dir.startswith("/opt/ml")
    ):
        program[MODEL_DIR_PARAM] = f"{model_dir}/{job_name}/model"
    return program


def _parse_program(hyperparameters: Mapping[str, Any], env: Mapping[str, str]) -> Program:
    program = env.get("SAGEMAKER_PROGRAM") or hyperparameters.get(PROGRAM_PARAM)
    submit_dir = env.get("SAGEMAKER_SUBMIT_DIRECTORY") or hyperparameters.get(SUBMIT_DIR_PARAM)
    if program in (None, ""):
        if submit_dir not in (None, ""):
            raise ContractError(
                f"hyperparameter {SUBMIT_DIR_PARAM} is set but {PROGRAM_PARAM} is not: "
                "name the script to run"
            )
        if env.get(IMAGE_FLAVOR_ENV, "").startswith("torch"):
            raise ContractError(
                f"the built-in model is TensorFlow, not in the torch image: set {PROGRAM_PARAM}"
            )
        return BuiltinProgram()
    if not isinstance(program, str):
        raise ContractError(f"hyperparameter {PROGRAM_PARAM}={program!r} is not a file name")
    if Path(program).is_absolute() or ".." in Path(program).parts:
        raise ContractError(
            f"hyperparameter {PROGRAM_PARAM}={program!r} must be relative to the submit directory"
        )
    return UserScript(program=program, submit_dir=str(submit_dir or "/opt/ml/code"))


def _decode_hyperparameters(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    decoded = {}
    for name, value in raw.items():
        if not _HYPERPARAMETER_NAME.match(name):
            raise ContractError(f"{source}: {name!r} is not a valid name")
        decoded[name] = decode_hyperparameter(value)
    return decoded


def _check_channels(input_data_config: Mapping[str, Any], source: str) -> None:
    for channel, config in input_data_config.items():
        if not _CHANNEL_NAME.match(channel):
            raise ContractError(f"{source}: {channel!r} is not a channel name")
        if not isinstance(config, dict):
            raise ContractError(f"{source}: channel {channel!r} must map to an object")


def parse_contract(
    *,
    resource_config_text: str,
    hyperparameters_text: str | None,
    input_data_config_text: str | None,
    env: Mapping[str, str],
    paths: ContractPaths = ContractPaths(),
    sdk3_job: sdk3.Sdk3Job | None = None,
) -> Contract:
    """Turn the contract's file contents and environment into a Contract, or raise
    ContractError with one line that names the file or variable at fault. `sdk3_job`: what SDK
    v3's ModelTrainer asked for where its driver command was replaced by `train` (sdk3.py)."""
    resource_source = str(paths.resource_config)
    resource_config = _load_json_object(resource_config_text, resource_source)
    raw_hyperparameters = (
        _load_json_object(hyperparameters_text, str(paths.hyperparameters))
        if hyperparameters_text is not None
        else {}
    )
    input_data_config = (
        _load_json_object(input_data_config_text, str(paths.input_data_config))
        if input_data_config_text is not None
        else {}
    )
    hosts = parse_hosts(resource_config, env, resource_source)
    current_host = parse_current_host(resource_config, env, hosts, resource_source)
    interface = resource_config.get("network_interface_name", "eth0")
    if not isinstance(interface, str) or not _INTERFACE_NAME.match(interface):
        raise ContractError(
            f"{resource_source}: network_interface_name {interface!r} is not an interface name"
        )
    decoded = _decode_hyperparameters(raw_hyperparameters, str(paths.hyperparameters))
    code_channel = str(paths.data_dir / sdk3.CODE_CHANNEL)
    request = sdk3.sdk3_request(sdk3_job, code_dir=code_channel) if sdk3_job is not None else None
    if request is not None:
        # v3's driver, as the hyperparameters v2's estimators send for the same launch.
        decoded = {**decoded, **request.hyperparameters}
    _check_channels(input_data_config, str(paths.input_data_config))
    try:
        settings = parse_entrypoint_settings(decoded)
    except ContractError as error:
        raise ContractError(f"{paths.hyperparameters}: {error}") from None
    job_name = (
        env.get("TRAINING_JOB_NAME") or hyperparameter_text(decoded.get(JOB_NAME_PARAM, "")) or None
    )
    program = _parse_program(decoded, env)
    if request is not None and request.runs_sdk_command:
        program = ShellCommand(("/bin/bash", "-c", env.get(sdk3.SDK3_COMMAND_ENV, "")))
    elif request is not None and request.requirements and isinstance(program, UserScript):
        program = dataclasses.replace(program, requirements=request.requirements)
    groups, current_group = parse_instance_groups(
        resource_config, hosts, current_host, resource_source
    )
    try:
        check_distribution_in_image(decoded, env.get(IMAGE_FLAVOR_ENV, ""))
        distribution_group = choose_distribution_group(
            [group.name for group in groups], decoded, settings.backend
        )
        distribution_count = (
            len(hosts)
            if distribution_group is None
            else len(next(g for g in groups if g.name == distribution_group).hosts)
        )
        check_backend_in_image(settings.backend, env.get(IMAGE_FLAVOR_ENV, ""))
        check_backend_fits(
            settings.backend,
            distribution_count,
            builtin_program=isinstance(program, BuiltinProgram),
        )
    except ContractError as error:
        raise ContractError(f"{paths.hyperparameters}: {error}") from None
    return Contract(
        current_host=current_host,
        hosts=tuple(sorted(hosts)),
        network_interface_name=interface,
        current_instance_type=str(resource_config.get("current_instance_type", "local")),
        program_hyperparameters=program_hyperparameters(decoded, job_name=job_name),
        all_hyperparameters=decoded,
        channels=tuple(sorted(input_data_config)),
        input_data_config=input_data_config,
        resource_config=resource_config,
        program=program,
        settings=settings,
        job_name=job_name,
        paths=paths,
        sdk3_job=sdk3_job,
        instance_groups=groups,
        current_group=current_group,
        distribution_group=distribution_group,
    )


def read_contract(paths: ContractPaths, env: Mapping[str, str]) -> Contract:
    """Read the contract files (hyperparameters and input data config are optional, as the
    platform omits them when empty) and parse them."""

    def read(path: Path, *, required: bool) -> str | None:
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if required:
                raise ContractError(f"{path}: missing (is /opt/ml mounted?)") from None
            return None
        except (OSError, UnicodeDecodeError) as error:
            raise ContractError(f"{path}: unreadable ({error})") from None

    resource_text = read(paths.resource_config, required="SM_HOSTS" not in env)
    if resource_text is None:
        # SM_HOSTS and SM_CURRENT_HOST alone describe the cluster.
        resource_text = "{}"
    sdk3_job = None
    if env.get(sdk3.SDK3_COMMAND_ENV):
        try:
            sdk3_job = sdk3.read_sdk3_job(paths.data_dir / sdk3.DRIVERS_CHANNEL)
        except sdk3.Sdk3Error as error:
            raise ContractError(str(error)) from None
    return parse_contract(
        resource_config_text=resource_text,
        hyperparameters_text=read(paths.hyperparameters, required=False),
        input_data_config_text=read(paths.input_data_config, required=False),
        env=env,
        paths=paths,
        sdk3_job=sdk3_job,
    )
