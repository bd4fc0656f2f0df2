"""The image itself: what SageMaker and users run, and what must never be inside it."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from harness.mltree import write_ml_tree

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

MACHINE_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+-----END CERTIFICATE-----")
# A whole key, header, base64 body and footer: code that merely names the header (ssh-keygen,
# cryptography's parser) is not a key.
_PRIVATE_KEY = re.compile(
    rb"-----BEGIN (?:OPENSSH |RSA |EC |DSA |ENCRYPTED )?PRIVATE KEY-----\s+"
    rb"[A-Za-z0-9+/=\s]{64,}-----END (?:OPENSSH |RSA |EC |DSA |ENCRYPTED )?PRIVATE KEY-----"
)


def run(docker: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [docker, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_check_build_lists_tensorflow_mpi_and_gloo(docker, image):
    result = run(docker, "run", "--rm", image, "horovodrun", "--check-build")
    assert result.returncode == 0, result.stderr
    for line in ("[X] TensorFlow", "[X] MPI", "[X] Gloo"):
        assert line in result.stdout


def test_no_command_prints_usage_and_fails(docker, image):
    result = run(docker, "run", "--rm", image)
    assert result.returncode == 64
    assert "usage: docker run IMAGE train" in result.stderr


def test_train_is_our_entry_point_and_sshd_config_is_valid(docker, image):
    script = (
        'set -e; head -5 "$(command -v train)"; '
        "ssh-keygen -q -t ed25519 -N '' -f /tmp/k; "
        "/usr/sbin/sshd -T -o HostKey=/tmp/k | grep -iE '^(passwordauthentication|permitrootlogin)'"
    )
    result = run(docker, "run", "--rm", image, "bash", "-c", script)
    assert result.returncode == 0, result.stderr
    assert "from entrypoint.main import main" in result.stdout
    assert "passwordauthentication no" in result.stdout
    assert "permitrootlogin without-password" in result.stdout


def _layer_files(docker: str, image: str):
    """(layer, path, content) of every regular file up to 1 MiB in every layer of the image,
    streamed from `docker save` (whole layers, so files later deleted are seen too)."""
    save = subprocess.Popen([docker, "save", image], stdout=subprocess.PIPE)
    assert save.stdout is not None
    with tarfile.open(fileobj=save.stdout, mode="r|") as outer:
        for member in outer:
            if not member.isfile() or not member.name.endswith("layer.tar"):
                continue
            layer = outer.extractfile(member)
            with tarfile.open(fileobj=layer, mode="r|") as inner:
                for entry in inner:
                    if entry.isfile() and entry.size <= 1 << 20:
                        handle = inner.extractfile(entry)
                        if handle is not None:
                            yield member.name, entry.name, handle.read()
    assert save.wait(timeout=60) == 0


def test_no_private_key_and_no_build_ca_bundle_in_any_layer(docker, image):
    image_bundle = run(docker, "run", "--rm", image, "cat", str(MACHINE_CA_BUNDLE)).stdout
    image_certs = set(_PEM_CERT.findall(image_bundle.encode()))
    machine_bundle = MACHINE_CA_BUNDLE.read_bytes() if MACHINE_CA_BUNDLE.exists() else b""
    # Certificates only this machine trusts: a TLS-intercepting proxy's CA, passed to the build
    # as a secret. None of them may be in any layer.
    build_only_certs = set(_PEM_CERT.findall(machine_bundle)) - image_certs
    keys, leaked = [], []
    for layer, path, content in _layer_files(docker, image):
        if _PRIVATE_KEY.search(content):
            keys.append(f"{layer}:{path}")
        if build_only_certs and any(cert in content for cert in build_only_certs):
            leaked.append(f"{layer}:{path}")
        if machine_bundle and content == machine_bundle and build_only_certs:
            leaked.append(f"{layer}:{path}")
    assert keys == [], f"private keys in image layers: {keys}"
    assert leaked == [], f"the build's CA bundle leaked into image layers: {leaked}"


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("malformed-json", "BadInput: /opt/ml/input/config/resourceconfig.json: malformed JSON"),
        ("unknown-host", "BadInput: /opt/ml/input/config/resourceconfig.json: current host"),
        ("missing-channel", "BadInput: /opt/ml/input/config/inputdataconfig.json: required "
         "channel 'train' is missing"),
        ("bad-hyperparameter", "BadInput: /opt/ml/input/config/hyperparameters.json: "
         "hyperparameter epochs='ten' is not an integer"),
        ("bad-ranks", "BadInput: /opt/ml/input/config/hyperparameters.json: "
         "hyperparameter ranks_per_host='0' is not a positive integer"),
    ],
)  # fmt: skip
def test_bad_input_fails_fast_with_one_line(docker, image, tmp_path, case, expected):
    root = write_ml_tree(
        tmp_path / "ml",
        hosts=["algo-1", "algo-2"],
        current_host="algo-1",
        hyperparameters={"epochs": "2"},
        channels=["train"],
    )
    config = root / "input" / "config"
    (root / "input" / "data" / "train").mkdir()
    if case == "malformed-json":
        (config / "resourceconfig.json").write_text('{"hosts": ["algo-1"')
    elif case == "unknown-host":
        (config / "resourceconfig.json").write_text(
            json.dumps({"current_host": "algo-9", "hosts": ["algo-1", "algo-2"]})
        )
    elif case == "missing-channel":
        (config / "inputdataconfig.json").write_text("{}")
        (root / "input" / "data" / "train").rmdir()
    elif case == "bad-hyperparameter":
        (config / "hyperparameters.json").write_text(json.dumps({"epochs": "ten"}))
    elif case == "bad-ranks":
        (config / "hyperparameters.json").write_text(json.dumps({"ranks_per_host": "0"}))
    result = run(
        docker, "run", "--rm", "--hostname", "algo-1", "-e", "TRAINING_JOB_NAME=bad-input",
        "-v", f"{root}:/opt/ml", image, "train", timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    failure = (root / "output" / "failure").read_text()
    assert failure.startswith(expected), failure
    assert failure.count("\n") == 1
    assert "Traceback" not in result.stdout + result.stderr
    # Nothing was started: no sshd, no mpirun.
    assert "starting sshd" not in result.stdout
    assert "mpirun" not in result.stdout
