"""The entry point's parameter server (AWS's toolkit's `_run_ps`): its spec from TF_CONFIG,
pure; its one-line refusals; and that the entry point's own process never loads TensorFlow."""

from __future__ import annotations

import subprocess
import sys

import pytest

from entrypoint.launches.tf_distribute.layouts import (
    tf_config,
    toolkit_ps_cluster,
    toolkit_ps_tasks,
)
from entrypoint.launches.tf_distribute.ps_server import ServerSpec, ServerSpecError, server_spec

HOSTS = ("algo-1", "algo-2")


def test_the_spec_of_each_hosts_server():
    cluster = toolkit_ps_cluster(HOSTS)
    for index, host in enumerate(HOSTS):
        _, ps = toolkit_ps_tasks(HOSTS, host)
        spec = server_spec(tf_config(cluster, ps))
        assert spec == ServerSpec(
            {
                "master": ["algo-1:2222"],
                "ps": ["algo-1:2223", "algo-2:2223"],
                "worker": ["algo-2:2222"],
            },
            index,
        )
        assert spec.address == f"{host}:2223"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "TF_CONFIG is not set"),
        ("", "TF_CONFIG is not set"),
        ("{", "TF_CONFIG is not a task's TF_CONFIG: Expecting property name enclosed in double "
         "quotes: line 1 column 2 (char 1)"),
        ('{"cluster": {}}', "TF_CONFIG is not a task's TF_CONFIG: 'task'"),
        ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "worker", "index": 0}}',
         "TF_CONFIG task type is 'worker', not 'ps'"),
        ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 1}}',
         "TF_CONFIG task ps:1 is not in the cluster's 1 ps"),
    ],
)  # fmt: skip
def test_refusals_are_one_line(value, message):
    with pytest.raises(ServerSpecError) as raised:
        server_spec(value)
    assert str(raised.value) == message


def test_a_bad_tf_config_exits_2_with_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint.launches.tf_distribute.ps_server"],
        env={"TF_CONFIG": '{"cluster": {}, "task": {"type": "ps", "index": 0}}'},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == "ServerSpecError: TF_CONFIG task ps:0 is not in the cluster's 0 ps\n"


def test_planning_a_ps_job_loads_no_tensorflow():
    code = (
        "import sys\n"
        "from entrypoint import launches, main, supervise\n"
        "from entrypoint.plan import make_plan\n"
        "from tests.test_entrypoint_tf_config import parse\n"
        "hyperparameters = {'sagemaker_parameter_server_enabled': 'true', "
        "'sagemaker_program': 'a.py'}\n"
        "launch = make_plan(parse(hyperparameters), gpu_count=0).launch\n"
        "launches.local_part(launch, is_master=True, host='algo-1')\n"
        "served = ('tensorflow', 'entrypoint.launches.tf_distribute.ps_server')\n"
        "print(sorted(m for m in sys.modules if m.startswith(served)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout == "[]\n"
