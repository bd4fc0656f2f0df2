"""The cluster: the host list, this host, the instance groups of a heterogeneous cluster and the
one that runs the distributed program. Pure (package __init__ has the types)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from entrypoint.contract import (
    DISTRIBUTION_GROUPS_PARAM,
    HOMOGENEOUS_GROUP,
    Backend,
    ContractError,
    InstanceGroup,
    hyperparameter_text,
)

# RFC 1123 labels: what Docker and SageMaker accept as host names.
_HOST_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.\-]{0,251}[A-Za-z0-9])?$")


def parse_hosts_env(text: str) -> tuple[str, ...]:
    try:
        hosts = json.loads(text)
    except ValueError:
        # Tolerate the comma-separated form people type by hand.
        hosts = [part.strip() for part in text.split(",") if part.strip()]
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise ContractError(f"SM_HOSTS: expected a JSON list of host names, got {text!r}")
    return tuple(hosts)


def parse_hosts(
    resource_config: Mapping[str, Any], env: Mapping[str, str], resource_source: str
) -> tuple[str, ...]:
    if "SM_HOSTS" in env:
        hosts = parse_hosts_env(env["SM_HOSTS"])
        source = "SM_HOSTS"
    else:
        raw_hosts = resource_config.get("hosts")
        if not isinstance(raw_hosts, list) or not all(isinstance(h, str) for h in raw_hosts):
            raise ContractError(f"{resource_source}: 'hosts' must be a list of host names")
        hosts = tuple(raw_hosts)
        source = resource_source
    if not hosts:
        raise ContractError(f"{source}: the host list is empty")
    for host in hosts:
        if not _HOST_NAME.match(host):
            raise ContractError(f"{source}: {host!r} is not a valid host name")
    duplicates = sorted({host for host in hosts if hosts.count(host) > 1})
    if duplicates:
        raise ContractError(f"{source}: duplicate hosts {', '.join(duplicates)}")
    return hosts


def parse_current_host(
    resource_config: Mapping[str, Any],
    env: Mapping[str, str],
    hosts: tuple[str, ...],
    resource_source: str,
) -> str:
    current_host = env.get("SM_CURRENT_HOST") or resource_config.get("current_host")
    source = "SM_CURRENT_HOST" if env.get("SM_CURRENT_HOST") else resource_source
    if not isinstance(current_host, str) or not current_host:
        raise ContractError(f"{resource_source}: 'current_host' is missing")
    if current_host not in hosts:
        raise ContractError(
            f"{source}: current host {current_host!r} is not in the host list [{', '.join(hosts)}]"
        )
    return current_host


def parse_group(entry: Any, index: int, source: str) -> InstanceGroup:
    """One entry of resourceconfig.json's instance_groups."""
    if not isinstance(entry, dict):
        raise ContractError(f"{source}: instance_groups[{index}] must be an object")
    name = entry.get("instance_group_name")
    if not isinstance(name, str) or not name:
        raise ContractError(f"{source}: instance_groups[{index}] has no instance_group_name")
    group_type = entry.get("instance_type", "local")
    if not isinstance(group_type, str) or not group_type:
        raise ContractError(f"{source}: instance group {name!r}: bad instance_type")
    group_hosts = entry.get("hosts")
    if not isinstance(group_hosts, list) or not all(isinstance(h, str) for h in group_hosts):
        raise ContractError(f"{source}: instance group {name!r}: 'hosts' must be a list")
    if not group_hosts:
        raise ContractError(f"{source}: instance group {name!r} has no hosts")
    return InstanceGroup(name, group_type, tuple(group_hosts))


def group_owners(
    groups: Sequence[InstanceGroup], hosts: tuple[str, ...], source: str
) -> dict[str, str]:
    """host -> its group's name; every host in exactly one group, every group host a host."""
    owner: dict[str, str] = {}
    for group in groups:
        for host in group.hosts:
            if host in owner:
                where = "twice" if owner[host] == group.name else f"and in group {owner[host]!r}"
                raise ContractError(
                    f"{source}: host {host} is in instance group {group.name!r} {where}"
                )
            if host not in hosts:
                raise ContractError(
                    f"{source}: instance group {group.name!r} lists {host}, which is not in the "
                    f"host list [{', '.join(hosts)}]"
                )
            owner[host] = group.name
    stray = [host for host in hosts if host not in owner]
    if stray:
        raise ContractError(f"{source}: host {', '.join(stray)} is in no instance group")
    return owner


def parse_instance_groups(
    resource_config: Mapping[str, Any],
    hosts: tuple[str, ...],
    current_host: str,
    source: str,
) -> tuple[tuple[InstanceGroup, ...], str]:
    """The job's instance groups (file order) and the current host's group. Without
    `instance_groups` (local mode, a hand-written file) the job is one group over every host,
    named as the toolkit names it. Every host is in exactly one group, no group is empty."""
    current_name = resource_config.get("current_group_name")
    if current_name is not None and (not isinstance(current_name, str) or not current_name):
        raise ContractError(f"{source}: current_group_name {current_name!r} is not a group name")
    raw = resource_config.get("instance_groups")
    if raw is None or raw == []:
        name = current_name or HOMOGENEOUS_GROUP
        instance_type = str(resource_config.get("current_instance_type", "local"))
        return (InstanceGroup(name, instance_type, tuple(sorted(hosts))),), name
    if not isinstance(raw, list):
        raise ContractError(f"{source}: 'instance_groups' must be a list of groups")
    groups: list[InstanceGroup] = []
    for index, entry in enumerate(raw):
        group = parse_group(entry, index, source)
        if any(other.name == group.name for other in groups):
            raise ContractError(f"{source}: instance group {group.name!r} is listed twice")
        groups.append(group)
    current_group = group_owners(groups, hosts, source)[current_host]
    if current_name is not None and current_name != current_group:
        raise ContractError(
            f"{source}: current_group_name is {current_name!r} but current host "
            f"{current_host} is in instance group {current_group!r}"
        )
    return tuple(groups), current_group


def choose_distribution_group(
    group_names: Sequence[str], hyperparameters: Mapping[str, Any], backend: Backend
) -> str | None:
    """The one group that runs the distributed program: the one sagemaker_distribution_-
    instance_groups names (a JSON list of exactly one group, as the SDK sends it), else the
    only group. With several groups and no such hyperparameter there is no safe guess (the
    toolkit would give each group a world of its own, CPU groups too): the job fails, except
    a per-host job (sagemaker_mpi_enabled=false), where every host's program is the job (None)."""
    if DISTRIBUTION_GROUPS_PARAM in hyperparameters:
        raw = hyperparameters[DISTRIBUTION_GROUPS_PARAM]
        given = f"hyperparameter {DISTRIBUTION_GROUPS_PARAM}={hyperparameter_text(raw)}"
        if not isinstance(raw, list) or not all(isinstance(name, str) for name in raw):
            raise ContractError(f"{given} is not a JSON list of instance group names")
        if len(raw) != 1:
            raise ContractError(
                f"{given} names {len(raw)} groups: exactly one instance group can be distributed"
            )
        if raw[0] not in group_names:
            raise ContractError(
                f"{given}: the job has no instance group {raw[0]!r} "
                f"(groups: {', '.join(group_names)})"
            )
        return str(raw[0])
    if len(group_names) == 1:
        return group_names[0]
    if backend is Backend.PER_HOST:
        return None
    raise ContractError(
        f"{len(group_names)} instance groups ({', '.join(group_names)}) and no hyperparameter "
        f"{DISTRIBUTION_GROUPS_PARAM}: name the one group that runs the {backend.value} program "
        "(the SDK's distribution={..., 'instance_groups': [group]}, or launch's "
        "--distribution-group)"
    )
