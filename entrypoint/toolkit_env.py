"""Every SM_* (and SAGEMAKER_*) variable the program gets from the toolkit's contract, in one
module: the names and encodings of the sagemaker-training toolkit (environment.py
Environment.to_env_vars, mapping.to_env_vars), tested against the toolkit's own Environment
(tests/test_entrypoint_groups.py, tests/test_entrypoint_plan.py). Pure.

plan.rank_environment adds the entry point's own variables (the interface pins, the rank
registry's socket) on top.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sagemaker_training import mapping, params

from entrypoint import sdk3
from entrypoint.contract import (
    JOB_NAME_PARAM,
    REGION_PARAM,
    Contract,
    InstanceGroup,
    UserScript,
    hyperparameter_text,
)


def toolkit_environment(contract: Contract, env: Mapping[str, str]) -> dict[str, str]:
    """The variables the toolkit sets for the program from its hyperparameters
    (environment.py Environment.__init__ and to_env_vars()): the job name and region
    (sagemaker_job_name, sagemaker_region, else the container's AWS_REGION), SM_LOG_LEVEL; and
    for an SDK v3 job the variables v3's environment.py adds (sdk3.sdk3_environment)."""
    hyperparameters = contract.all_hyperparameters
    region = hyperparameters.get(REGION_PARAM) or env.get("AWS_REGION") or ""
    variables = {
        params.JOB_NAME_ENV: hyperparameter_text(hyperparameters.get(JOB_NAME_PARAM, "")),
        params.REGION_NAME_ENV: hyperparameter_text(region),
        "SM_LOG_LEVEL": str(contract.settings.log_level),
    }
    if contract.sdk3_job is not None:
        variables |= sdk3.sdk3_environment(
            contract.sdk3_job,
            hosts=contract.hosts,
            current_host=contract.current_host,
            code_dir=str(contract.paths.data_dir / sdk3.CODE_CHANNEL),
            master_host=contract.master_host,
        )
    return variables


def instance_group_environment(
    groups: Sequence[InstanceGroup], current_group: str, distribution_group: str | None
) -> dict[str, str]:
    """The toolkit's instance-group variables for the program (environment.py to_env_vars,
    encoded by its own mapping.to_env_vars): SM_CURRENT_INSTANCE_GROUP,
    SM_CURRENT_INSTANCE_GROUP_HOSTS, SM_INSTANCE_GROUPS, SM_INSTANCE_GROUPS_DICT,
    SM_DISTRIBUTION_INSTANCE_GROUPS, SM_IS_HETERO. The distribution groups are the one this
    job distributes ([] for a per-host job over several groups that names none)."""
    current = next(group for group in groups if group.name == current_group)
    return mapping.to_env_vars(
        {
            "current_instance_group": current.name,
            "current_instance_group_hosts": list(current.hosts),
            "instance_groups": [group.name for group in groups],
            "instance_groups_dict": {group.name: group.as_toolkit_dict() for group in groups},
            "distribution_instance_groups": (
                [] if distribution_group is None else [distribution_group]
            ),
            "is_hetero": len(groups) > 1,
        }
    )


def framework_parameters(contract: Contract) -> dict[str, object]:
    """The toolkit's additional_framework_parameters: sagemaker_* hyperparameters it does not
    know itself (SM_FRAMEWORK_PARAMS)."""
    return {
        name: value
        for name, value in contract.all_hyperparameters.items()
        if name.startswith(params.SAGEMAKER_PREFIX) and name not in params.SAGEMAKER_HYPERPARAMETERS
    }


def sagemaker_environment(contract: Contract, *, gpu_count: int, cpu_count: int) -> dict[str, str]:
    """The SM_* variables the sagemaker-training toolkit defines for a training script, built
    with the toolkit's own encoder (sagemaker_training.mapping.to_env_vars)."""
    paths = contract.paths
    hyperparameters = {
        name: value
        for name, value in contract.all_hyperparameters.items()
        if name in contract.program_hyperparameters
    }
    user_entry_point = (
        contract.program.program if isinstance(contract.program, UserScript) else None
    )
    fields: dict[str, object] = {
        "hosts": list(contract.hosts),
        "current_host": contract.current_host,
        "current_instance_type": contract.current_instance_type,
        "network_interface_name": contract.network_interface_name,
        "hps": hyperparameters,
        "user_entry_point": user_entry_point,
        "module_name": user_entry_point,
        "module_dir": str(paths.code_dir),
        "channels": list(contract.channels),
        "input_data_config": dict(contract.input_data_config),
        "resource_config": dict(contract.resource_config),
        "input_dir": str(paths.ml_root / "input"),
        "input_config_dir": str(paths.config_dir),
        "output_dir": str(paths.output_dir),
        "output_data_dir": str(paths.output_dir / "data"),
        "output_intermediate_dir": str(paths.output_dir / "intermediate"),
        "model_dir": str(paths.model_dir),
        "num_gpus": gpu_count,
        "num_cpus": cpu_count,
        "user_args": mapping.to_cmd_args(dict(contract.program_hyperparameters)),
        # The toolkit sets these too (to_env_vars); a script for AWS's containers may read them.
        "framework_params": framework_parameters(contract),
        "framework_module": None,
        "num_neurons": 0,
    }
    for channel in contract.channels:
        fields[f"channel_{channel}"] = str(paths.data_dir / channel)
    for name, value in hyperparameters.items():
        fields[f"hp_{name}"] = value
    fields["training_env"] = training_env(contract, hyperparameters, fields)
    return {
        **mapping.to_env_vars(fields),
        **instance_group_environment(
            contract.instance_groups, contract.current_group, contract.distribution_group
        ),
    }


def training_env(
    contract: Contract, hyperparameters: Mapping[str, object], fields: Mapping[str, object]
) -> dict[str, object]:
    """SM_TRAINING_ENV: every property of the toolkit's Environment (environment.py, dict(env)),
    with this job's master and distribution hosts (the toolkit's master_hostname: the first
    distribution host)."""
    by_name = {group.name: group for group in contract.instance_groups}
    current = by_name[contract.current_group]
    distribution = [] if contract.distribution_group is None else [contract.distribution_group]
    return {
        "additional_framework_parameters": framework_parameters(contract),
        "channel_input_dirs": {
            channel: str(contract.paths.data_dir / channel) for channel in contract.channels
        },
        "current_host": contract.current_host,
        "current_instance_group": current.name,
        "current_instance_group_hosts": list(current.hosts),
        "current_instance_type": contract.current_instance_type,
        "distribution_hosts": list(contract.distribution_hosts),
        "distribution_instance_groups": distribution,
        "framework_module": None,
        "hosts": list(contract.hosts),
        "hyperparameters": dict(hyperparameters),
        "input_config_dir": fields["input_config_dir"],
        "input_data_config": dict(contract.input_data_config),
        "input_dir": fields["input_dir"],
        "instance_groups": list(by_name),
        "instance_groups_dict": {name: group.as_toolkit_dict() for name, group in by_name.items()},
        "is_hetero": contract.is_hetero,
        "is_master": contract.current_host == contract.master_host,
        "is_modelparallel_enabled": None,
        "is_smddpmprun_installed": False,
        "is_smddprun_installed": False,
        "job_name": contract.job_name,
        "log_level": contract.settings.log_level,
        "master_hostname": contract.master_host,
        "model_dir": fields["model_dir"],
        "module_dir": fields["module_dir"],
        "module_name": fields["module_name"],
        "network_interface_name": contract.network_interface_name,
        "num_cpus": fields["num_cpus"],
        "num_gpus": fields["num_gpus"],
        "num_neurons": 0,
        "output_data_dir": fields["output_data_dir"],
        "output_dir": fields["output_dir"],
        "output_intermediate_dir": fields["output_intermediate_dir"],
        "resource_config": dict(contract.resource_config),
        "user_entry_point": fields["user_entry_point"],
    }
