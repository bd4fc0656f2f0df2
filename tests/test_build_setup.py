"""First contact: `make smoke` and `make test` on a machine behind a TLS-intercepting proxy.

The build trusts this machine's CA bundle by default, passed only as a BuildKit secret; a
download that still fails on a certificate ends with one line saying what to set; setting up
Docker is `make setup`, never a side effect of reading the Makefile (`make -n`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# What the Makefile's environment must not carry in from the caller's.
_MAKE_VARIABLES = ("CA_BUNDLE", "DOCKER", "IMAGE", "FLAVOR", "MAKEFLAGS", "MAKELEVEL")


def make(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if name not in _MAKE_VARIABLES}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def _fake_commands(folder: Path, script: str, names: tuple[str, ...]) -> str:
    """Executables named `names` in `folder`, all running `script`; returns a PATH with
    `folder` first."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        command = folder / name
        command.write_text(f"#!/bin/sh\n{script}\n")
        command.chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


def _secrets(dry_run: str) -> list[str]:
    return re.findall(r"--secret (\S+)", dry_run)


@pytest.mark.skipif(not SYSTEM_CA_BUNDLE.is_file(), reason="no system CA bundle here")
def test_build_passes_the_system_bundle_and_only_it_as_a_secret():
    result = make("-n", "build", "FLAVOR=cpu", "DOCKER=docker")
    assert result.returncode == 0, result.stderr
    assert _secrets(result.stdout) == [f"id=ca,src={SYSTEM_CA_BUNDLE}"]


@pytest.mark.parametrize(
    ("setting", "expected"),
    [("CA_BUNDLE=", []), ("CA_BUNDLE=/corp/ca.pem", ["id=ca,src=/corp/ca.pem"])],
)
def test_ca_bundle_setting_replaces_the_default(setting, expected):
    result = make("-n", "build", "FLAVOR=cpu", "DOCKER=docker", setting)
    assert result.returncode == 0, result.stderr
    assert _secrets(result.stdout) == expected


def test_reading_the_makefile_installs_and_starts_nothing(tmp_path):
    """`make -n test` and `make help` list commands; they must not run apt-get or dockerd."""
    record = tmp_path / "ran"
    path = _fake_commands(
        tmp_path / "bin", f'echo "$0 $*" >> {record}; exit 1', ("apt-get", "dockerd", "sudo")
    )
    for args in (("-n", "test"), ("-n", "smoke"), ("help",)):
        result = make(*args, path=path)
        assert result.returncode == 0, result.stderr
    assert not record.exists(), record.read_text()
    # The dry run shows the explicit step instead.
    assert "docker/setup-docker.sh" in make("-n", "test", path=path).stdout


def test_a_certificate_error_in_the_build_ends_with_what_to_set(tmp_path):
    """A docker client whose build fails as pip does behind an untrusted proxy (its lines as
    measured in the image without the proxy's CA: the last ones do not name the cause)."""
    pip_error = (
        "Could not fetch URL https://pypi.org/simple/six/: There was a problem confirming the ssl "
        "certificate: HTTPSConnectionPool(host='pypi.org', port=443): Max retries exceeded with "
        "url: /simple/six/ (Caused by SSLError(SSLCertVerificationError(1, "
        "'[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in "
        "certificate chain')))"
    )
    script = (
        'case "$1 $2" in "buildx build") '
        f'echo "#12 3.1 {pip_error}" >&2; '
        "echo '#12 3.2 ERROR: No matching distribution found for six' >&2; exit 1;; esac; exit 0"
    )
    path = _fake_commands(tmp_path / "bin", script, ("docker",))
    result = make(
        "build", "FLAVOR=cpu", "DOCKER=docker", "CA_BUNDLE=", f"BUILD_LOG={tmp_path}/build.log",
        path=path,
    )  # fmt: skip
    assert result.returncode != 0
    ours = [line for line in result.stderr.splitlines() if not line.startswith("make")]
    assert ours[-1] == (
        "error: a download in the build did not trust the TLS certificate it got "
        "(CA_BUNDLE=none): set CA_BUNDLE=<your proxy's CA bundle, PEM>"
    ), result.stderr
    assert pip_error in (tmp_path / "build.log").read_text()


def test_check_docker_says_how_to_get_an_engine(tmp_path):
    path = _fake_commands(tmp_path / "bin", "exit 1", ("docker",))
    result = make("check-docker", "DOCKER=docker", path=path)
    assert result.returncode != 0
    assert "run 'make setup'" in result.stderr


@pytest.mark.docker
@pytest.mark.timeout(60)
def test_no_trace_of_the_build_bundle_in_the_image_config_or_history(docker, image):
    """The secret is a mount of single RUN steps: no ENV, label or ADD/COPY names it (every
    layer's files are scanned for its certificates by tests/test_image.py)."""
    inspect = subprocess.run(
        [docker, "image", "inspect", "--format", "{{json .Config}}", image],
        capture_output=True,
        text=True,
        check=True,
    )
    config = json.loads(inspect.stdout)
    names = " ".join([*(config.get("Env") or []), *(config.get("Labels") or {})])
    for variable in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "CURL_CA_BUNDLE"):
        assert variable not in names
    history = subprocess.run(
        [docker, "history", "--no-trunc", "--format", "{{.CreatedBy}}", image],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    # Only a RUN step may name the bundle (its own `export PIP_CERT=`), never ENV, COPY or ADD.
    naming = [step for step in history if "ca-certificates.crt" in step]
    assert naming, "the build's pip steps name the bundle they mount"
    assert all(step.startswith("RUN ") for step in naming), naming
