"""The heterogeneous example's data side, for real: roles from the toolkit's variables, and its
batch server as its own process (real sockets, SIGTERM), no TensorFlow needed."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "hetero" / "hetero_digits.py"
_spec = importlib.util.spec_from_file_location("hetero_digits", SCRIPT)
assert _spec is not None and _spec.loader is not None
hetero = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hetero)

GROUPS_DICT = json.dumps(
    {
        "data_group": {
            "hosts": ["algo-4", "algo-2"],
            "instance_group_name": "data_group",
            "instance_type": "ml.c5.18xlarge",
        },
        "dnn_group": {
            "hosts": ["algo-3", "algo-1"],
            "instance_group_name": "dnn_group",
            "instance_type": "ml.p4d.24xlarge",
        },
    }
)


def group_env(group: str) -> dict[str, str]:
    return {
        "SM_CURRENT_INSTANCE_GROUP": group,
        "SM_DISTRIBUTION_INSTANCE_GROUPS": '["dnn_group"]',
        "SM_INSTANCE_GROUPS_DICT": GROUPS_DICT,
    }


def test_roles_from_the_toolkits_variables():
    assert hetero.is_training_host(group_env("dnn_group"))
    assert not hetero.is_training_host(group_env("data_group"))
    assert hetero.data_hosts(group_env("dnn_group")) == ["algo-4", "algo-2"]
    assert hetero.data_hosts({}) == []


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("train")
    hetero.write_data(folder)
    return folder


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_batches_are_preprocessed_digits(data_dir: Path):
    digits = hetero.Digits(data_dir / hetero.DATA_FILE)
    assert len(digits.train_y) + len(digits.test_y) == 1797
    x, y = digits.batch(np.random.default_rng(0), 16)
    assert x.shape == (16, 64) and x.dtype == np.float32
    assert x.min() >= 0.0 and x.max() <= 1.0
    assert set(y) <= set(range(10))


def test_the_data_server_serves_until_sigterm_then_exits_0(data_dir: Path):
    port = free_port()
    env = {
        **os.environ,
        **group_env("data_group"),
        "SM_CURRENT_HOST": "algo-4",
        "SM_CHANNEL_TRAIN": str(data_dir),
    }
    server = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--data_port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        stream = hetero.connect("127.0.0.1", port, timeout_s=30)
        with stream:
            x, y = hetero.fetch(stream, "NEXT 8")
            assert x.shape == (8, 64) and y.shape == (8,)
            test_x, test_y = hetero.fetch(stream, "TEST")
            assert len(test_y) == 360 and test_x.shape == (360, 64)
        time.sleep(0.2)
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, output
    assert "data host algo-4 (group data_group) serving batches on port" in output
    assert "data host algo-4 stopped by SIGTERM after serving 1 batches" in output
