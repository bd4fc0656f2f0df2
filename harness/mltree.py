"""Build a host's /opt/ml tree the way SageMaker lays it out, for tests and the smoke run.

https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-running-container.html
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path


def write_ml_tree(
    root: Path,
    *,
    hosts: Iterable[str],
    current_host: str,
    hyperparameters: Mapping[str, str] | None = None,
    channels: Iterable[str] = (),
    network_interface_name: str = "eth0",
    instance_groups: Mapping[str, tuple[str, Sequence[str]]] | None = None,
) -> Path:
    """Write input/config/*.json and the empty output folders; channel data is mounted (or
    copied) under input/data/<channel> by the caller. Returns root.

    `instance_groups` (name -> (instance type, hosts), in the file's order) makes a
    heterogeneous cluster's resourceconfig.json, as SageMaker writes it: every group with its
    hosts in the order given, and the current host's group and instance type."""
    config = root / "input" / "config"
    config.mkdir(parents=True, exist_ok=True)
    for folder in ("model", "output", "checkpoints", "input/data", "code"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    resource: dict[str, object] = {
        "current_host": current_host,
        "hosts": list(hosts),
        "network_interface_name": network_interface_name,
        "current_instance_type": "local",
        "current_group_name": "homogeneousCluster",
    }
    if instance_groups:
        resource["instance_groups"] = [
            {"instance_group_name": name, "instance_type": kind, "hosts": list(group_hosts)}
            for name, (kind, group_hosts) in instance_groups.items()
        ]
        for name, (kind, group_hosts) in instance_groups.items():
            if current_host in group_hosts:
                resource["current_group_name"] = name
                resource["current_instance_type"] = kind
    (config / "resourceconfig.json").write_text(json.dumps(resource))
    # SageMaker writes every hyperparameter value as a string.
    values = {name: str(value) for name, value in (hyperparameters or {}).items()}
    (config / "hyperparameters.json").write_text(json.dumps(values))
    input_data = {
        channel: {
            "TrainingInputMode": "File",
            "S3DistributionType": "FullyReplicated",
            "RecordWrapperType": "None",
        }
        for channel in channels
    }
    (config / "inputdataconfig.json").write_text(json.dumps(input_data))
    return root
