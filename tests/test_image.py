"""The image itself: what SageMaker and users run, and what must never be inside it."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import secrets
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from harness.mltree import write_ml_tree
from tests.conftest import image_name

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

MACHINE_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# The image's own CA bundle (Debian's ca-certificates).
IMAGE_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
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


def test_the_rsh_agent_is_a_standard_library_script(docker, image):
    """One agent per worker lives on the master for the whole job: no site-packages. Run
    wrongly, it exits as the rank shim does when it cannot run its program (NOT_RUN_EXIT_CODE)."""
    script = 'head -1 "$(command -v sm-horovod-rsh-agent)"; sm-horovod-rsh-agent; echo "exit=$?"'
    result = run(docker, "run", "--rm", image, "bash", "-c", script)
    assert result.stdout.splitlines() == ["#!/opt/venv/bin/python -IS", "exit=127"], result
    assert "usage: HOST COMMAND..." in result.stderr


def test_the_tensorflow_images_register_both_program_checks(docker, image):
    """The entry point imports neither the model nor tf_s3: their checks are registered."""
    code = "from entrypoint.main import registered_checks; print(sorted(registered_checks()))"
    result = run(docker, "run", "--rm", "--entrypoint", "python", image, "-c", code)
    assert result.stdout.strip() == "['builtin_program', 'model_dir']", result


def _layer_files(docker: str, image: str) -> Iterator[tuple[str, str, bytes]]:
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


@dataclasses.dataclass(frozen=True)
class LayerScan:
    """What the image's layers hold that must not be there, read once for every check."""

    # layer:path of every file holding a whole private key
    private_keys: tuple[str, ...]
    # layer:path -> the PEM certificates in that file
    certificates: dict[str, frozenset[bytes]]


def scan_layers(docker: str, image: str) -> LayerScan:
    keys, certificates = [], {}
    for layer, path, content in _layer_files(docker, image):
        if _PRIVATE_KEY.search(content):
            keys.append(f"{layer}:{path}")
        if b"-----BEGIN CERTIFICATE-----" in content:
            certificates[f"{layer}:{path}"] = frozenset(_PEM_CERT.findall(content))
    return LayerScan(tuple(keys), certificates)


def leaked(scan: LayerScan, build_only: set[bytes]) -> list[str]:
    """Where any of the certificates only the build was given stands in a layer."""
    return sorted(where for where, found in scan.certificates.items() if found & build_only)


def build_only_certs(docker: str, image: str, bundle: bytes) -> set[bytes]:
    """The certificates of a CA bundle given to the build that the image does not trust."""
    trusted = run(docker, "run", "--rm", image, "cat", IMAGE_CA_BUNDLE).stdout.encode()
    return set(_PEM_CERT.findall(bundle)) - set(_PEM_CERT.findall(trusted))


@pytest.fixture(scope="module")
def image_scan() -> LayerScan:
    """One `docker save` of the image under test for both layer checks."""
    return scan_layers(os.environ.get("DOCKER", "docker"), image_name())


def test_no_private_key_in_any_layer(image_scan):
    assert image_scan.private_keys == (), f"private keys in image layers: {image_scan.private_keys}"


def test_no_build_ca_in_any_layer(docker, image, image_scan):
    """The CA bundle the build was given (make's CA_BUNDLE, which .ci/run sets to this
    machine's) reaches it as a BuildKit secret: none of its CAs that the image does not trust
    itself (a TLS-intercepting proxy's) may be in any layer. Where that bundle adds none, no
    build-only CA could have leaked; test_the_layer_scan_finds_a_ca_a_build_leaked shows the
    check itself finds one."""
    bundle = Path(os.environ.get("CA_BUNDLE") or MACHINE_CA_BUNDLE)
    build_only = build_only_certs(docker, image, bundle.read_bytes() if bundle.is_file() else b"")
    if not build_only:
        pytest.skip(f"{bundle} holds no CA that the image does not already trust")
    assert leaked(image_scan, build_only) == []


def _throwaway_ca() -> bytes:
    """A self-signed CA certificate (PEM) nobody else has; its key is never written anywhere."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"leak test {secrets.token_hex(4)}")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM)


# A build that copies the secret into a layer: what the leak check must catch. Its final stage
# holds only that one file, so scanning it reads a few bytes, not the whole image.
_LEAKY_DOCKERFILE = """\
FROM {image} AS leak
RUN --mount=type=secret,id=ca,target=/run/ca.pem cp /run/ca.pem /leaked-ca.pem
FROM scratch
COPY --from=leak /leaked-ca.pem /opt/leaked-ca.pem
"""


def _buildkit_build(docker: str, context: Path, tag: str, secret: Path) -> None:
    """`docker build` with BuildKit, as the Makefile picks it: buildx where there is one.
    Without the cache: BuildKit leaves a secret's content out of its cache key, so a cached
    step would hold an earlier run's secret."""
    buildx = run(docker, "buildx", "version").returncode == 0
    command = [docker, "buildx", "build", "--load"] if buildx else [docker, "build"]
    command.append("--no-cache")
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    done = subprocess.run(
        [*command, "--secret", f"id=ca,src={secret}", "--tag", tag, str(context)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_layer_scan_finds_a_ca_a_build_leaked(docker, image, tmp_path):
    """The check above can fail: a bundle of the image's own CAs and a throwaway one, given to a
    build the way CA_BUNDLE is (a BuildKit secret) and copied into a layer, is found by its
    throwaway CA alone."""
    ca = _throwaway_ca()
    trusted = run(docker, "run", "--rm", image, "cat", IMAGE_CA_BUNDLE).stdout.encode()
    secret = tmp_path / "ca-bundle.crt"
    secret.write_bytes(trusted + ca)
    build_only = build_only_certs(docker, image, secret.read_bytes())
    assert build_only == {ca.strip()}
    (tmp_path / "Dockerfile").write_text(_LEAKY_DOCKERFILE.format(image=image))
    tag = f"sm-horovod-leak-test:{secrets.token_hex(4)}"
    try:
        _buildkit_build(docker, tmp_path, tag, secret)
        found = leaked(scan_layers(docker, tag), build_only)
    finally:
        run(docker, "image", "rm", "--force", tag)
    assert len(found) == 1
    assert found[0].endswith(":opt/leaked-ca.pem")


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
