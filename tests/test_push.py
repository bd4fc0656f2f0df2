"""`python -m launch push`: names, the ECR calls (Stubber), the docker argv (a recording fake),
and for real against a local registry (`docker-registry`) with the Docker engine."""

from __future__ import annotations

import base64
import io
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import boto3
import pytest
from botocore.stub import Stubber

from launch import push as push_mod
from launch.docker import Docker
from launch.errors import LaunchError

# botocore needs credentials and a region even for stubbed and moto calls.
pytestmark = pytest.mark.usefixtures("fake_aws_credentials")

REPO = Path(__file__).resolve().parent.parent
SHA = "0123456789ab"
ECR_HOST = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
PASSWORD = "ecr-token-password-never-on-argv"  # noqa: S105  (a fake for the test)


# --- pure --------------------------------------------------------------------------------


def test_plan_push_mutable() -> None:
    repo = push_mod.Repository(uri=f"{ECR_HOST}/sm-horovod")
    assert push_mod.plan_push(image="sm-horovod", flavor="gpu", sha=SHA, repo=repo) == (
        push_mod.PushPlan(
            source=f"sm-horovod:gpu-{SHA}",
            moving_source="sm-horovod:gpu",
            targets=(f"{ECR_HOST}/sm-horovod:gpu-{SHA}", f"{ECR_HOST}/sm-horovod:gpu"),
            printed_uri=f"{ECR_HOST}/sm-horovod:gpu-{SHA}",
        )
    )


def test_plan_push_immutable_pushes_only_the_sha_tag() -> None:
    repo = push_mod.Repository(uri="127.0.0.1:5000/x", immutable_tags=True)
    plan = push_mod.plan_push(image="sm-horovod", flavor="cpu", sha=SHA, repo=repo)
    assert plan.targets == (f"127.0.0.1:5000/x:cpu-{SHA}",)


def test_registry_host_and_token() -> None:
    assert push_mod.registry_host(f"https://{ECR_HOST}") == ECR_HOST
    assert push_mod.registry_host("http://127.0.0.1:5000/") == "127.0.0.1:5000"
    token = base64.b64encode(f"AWS:{PASSWORD}".encode()).decode()
    assert push_mod.decode_ecr_token(token) == ("AWS", PASSWORD)
    with pytest.raises(LaunchError, match="not base64"):
        push_mod.decode_ecr_token("%%%")
    with pytest.raises(LaunchError, match="not user:password"):
        push_mod.decode_ecr_token(base64.b64encode(b"nocolon").decode())
    assert PASSWORD not in repr(push_mod.RegistryLogin("h", "AWS", PASSWORD))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"flavor": "tpu"}, "flavor must be one of cpu, gpu, tf2.21, tf2.21-cpu, got 'tpu'"),
        ({"sha": "HEAD"}, "git sha must be 7-40 lowercase hex digits, got 'HEAD'"),
        ({"image": "SM-Horovod"}, "image name 'SM-Horovod' is not a valid lowercase repository"),
        ({"repository": "a//b"}, "repository name 'a//b' is not a valid ECR repository name"),
    ],
)
def test_check_names(kwargs: dict[str, str], message: str) -> None:
    args = {"image": "sm-horovod", "flavor": "cpu", "sha": SHA, "repository": "sm-horovod"}
    with pytest.raises(LaunchError) as info:
        push_mod.check_names(**{**args, **kwargs})
    assert str(info.value).startswith(message)


def test_registry_must_be_host_port() -> None:
    with pytest.raises(LaunchError, match=r"registry must be host\[:port\]"):
        push_mod.registry_repository(registry="http://127.0.0.1:5000", repository="x")


# --- ECR with Stubber ----------------------------------------------------------------------


def _repository(name: str, host: str, mutability: str = "MUTABLE") -> dict[str, Any]:
    return {
        "repositoryArn": f"arn:aws:ecr:us-east-1:123456789012:repository/{name}",
        "registryId": "123456789012",
        "repositoryName": name,
        "repositoryUri": f"{host}/{name}",
        "imageTagMutability": mutability,
        "imageScanningConfiguration": {"scanOnPush": True},
    }


def _stub_missing_repo_then_create(
    stub: Stubber, *, name: str, host: str, immutable: bool, endpoint: str
) -> None:
    stub.add_client_error(
        "describe_repositories",
        service_error_code="RepositoryNotFoundException",
        expected_params={"repositoryNames": [name]},
    )
    mutability = "IMMUTABLE" if immutable else "MUTABLE"
    stub.add_response(
        "create_repository",
        {"repository": _repository(name, host, mutability)},
        expected_params={
            "repositoryName": name,
            "imageTagMutability": mutability,
            "imageScanningConfiguration": {"scanOnPush": True},
        },
    )
    token = base64.b64encode(f"AWS:{PASSWORD}".encode()).decode()
    stub.add_response(
        "get_authorization_token",
        {"authorizationData": [{"authorizationToken": token, "proxyEndpoint": endpoint}]},
        expected_params={},
    )


def test_ensure_repository_uses_an_existing_one() -> None:
    ecr = boto3.client("ecr", region_name="us-east-1")
    with Stubber(ecr) as stub:
        stub.add_response(
            "describe_repositories",
            {"repositories": [_repository("sm-horovod", ECR_HOST, "IMMUTABLE")]},
            {"repositoryNames": ["sm-horovod"]},
        )
        repo = push_mod.ensure_ecr_repository(ecr, name="sm-horovod", immutable_tags=False)
    assert repo == push_mod.Repository(uri=f"{ECR_HOST}/sm-horovod", immutable_tags=True)


FAKE_DOCKER = """
import json, os, sys
log = os.environ["FAKE_DOCKER_LOG"]
stdin = "" if sys.stdin.isatty() else sys.stdin.read()
with open(log, "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "stdin": stdin}) + "\\n")
if sys.argv[1:3] == ["image", "inspect"]:
    print("sha256:" + "ab" * 32)
"""


@pytest.fixture
def fake_docker(tmp_path: Path) -> tuple[Docker, Path]:
    script = tmp_path / "fake_docker.py"
    script.write_text(FAKE_DOCKER)
    log = tmp_path / "docker.log"
    docker = Docker(command=f"{sys.executable} {script}", env={"FAKE_DOCKER_LOG": str(log)})
    return docker, log


def _calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.parametrize("immutable", [False, True])
def test_ecr_push_creates_repo_logs_in_on_stdin_tags_and_pushes(
    fake_docker: tuple[Docker, Path], immutable: bool
) -> None:
    docker, log = fake_docker
    ecr = boto3.client("ecr", region_name="us-east-1")
    with Stubber(ecr) as stub:
        _stub_missing_repo_then_create(
            stub,
            name="sm-horovod",
            host=ECR_HOST,
            immutable=immutable,
            endpoint=f"https://{ECR_HOST}",
        )
        uri = push_mod.push(
            docker=docker,
            image="sm-horovod",
            flavor="cpu",
            sha=SHA,
            repository="sm-horovod",
            ecr=ecr,
            immutable_tags=immutable,
        )
        stub.assert_no_pending_responses()
    assert uri == f"{ECR_HOST}/sm-horovod:cpu-{SHA}"
    calls = _calls(log)
    argvs = [c["argv"] for c in calls]
    pinned, moving = f"{ECR_HOST}/sm-horovod:cpu-{SHA}", f"{ECR_HOST}/sm-horovod:cpu"
    expected = [
        ["image", "inspect", "--format", "{{.Id}}", f"sm-horovod:cpu-{SHA}"],
        ["image", "inspect", "--format", "{{.Id}}", "sm-horovod:cpu"],
        ["login", "--username", "AWS", "--password-stdin", ECR_HOST],
        ["tag", f"sm-horovod:cpu-{SHA}", pinned],
        *([] if immutable else [["tag", f"sm-horovod:cpu-{SHA}", moving]]),
        ["push", pinned],
        *([] if immutable else [["push", moving]]),
    ]
    assert argvs == expected
    assert calls[2]["stdin"] == PASSWORD
    assert all(PASSWORD not in " ".join(a) for a in argvs)


def test_registry_push_makes_no_ecr_call_and_no_login(fake_docker: tuple[Docker, Path]) -> None:
    docker, log = fake_docker
    uri = push_mod.push(
        docker=docker,
        image="sm-horovod",
        flavor="gpu",
        sha=SHA,
        repository="team/sm-horovod",
        registry="registry.local:5000",
    )
    assert uri == f"registry.local:5000/team/sm-horovod:gpu-{SHA}"
    assert [c["argv"][0] for c in _calls(log)] == ["image", "image", "tag", "tag", "push", "push"]


def test_missing_local_image_is_a_clear_error(tmp_path: Path) -> None:
    script = tmp_path / "no_image.py"
    script.write_text("import sys; sys.exit(1)\n")
    docker = Docker(command=f"{sys.executable} {script}")
    with pytest.raises(LaunchError) as info:
        push_mod.push(
            docker=docker, image="sm-horovod", flavor="cpu", sha=SHA, repository="x", registry="h"
        )
    assert str(info.value) == (
        f"local image sm-horovod:cpu-{SHA} not found: run `make build FLAVOR=cpu` at this commit"
    )


def test_cli_push_error_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from launch.cli import main  # noqa: PLC0415

    script = tmp_path / "no_image.py"
    script.write_text("import sys; sys.exit(1)\n")
    argv = ["push", "--flavor", "cpu", "--registry", "127.0.0.1:5000", "--sha", SHA]
    code = main([*argv, "--docker", f"{sys.executable} {script}"])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.splitlines()[-1] == (
        f"error: local image sm-horovod:cpu-{SHA} not found: "
        "run `make build FLAVOR=cpu` at this commit"
    )


def test_resolve_ecr_image_uri() -> None:
    ecr = boto3.client("ecr", region_name="us-east-1")
    with Stubber(ecr) as stub:
        stub.add_response(
            "describe_repositories",
            {"repositories": [_repository("sm-horovod", ECR_HOST)]},
            {"repositoryNames": ["sm-horovod"]},
        )
        stub.add_response(
            "describe_images",
            {"imageDetails": []},
            {"repositoryName": "sm-horovod", "imageIds": [{"imageTag": f"gpu-{SHA}"}]},
        )
        stub.add_response(
            "describe_repositories",
            {"repositories": [_repository("sm-horovod", ECR_HOST)]},
            {"repositoryNames": ["sm-horovod"]},
        )
        stub.add_client_error("describe_images", service_error_code="ImageNotFoundException")
        uri = push_mod.resolve_ecr_image_uri(ecr, repository="sm-horovod", flavor="gpu", sha=SHA)
        assert uri == f"{ECR_HOST}/sm-horovod:gpu-{SHA}"
        with pytest.raises(LaunchError, match=r"run `make push FLAVOR=gpu` first"):
            push_mod.resolve_ecr_image_uri(ecr, repository="sm-horovod", flavor="gpu", sha=SHA)


# --- for real: Docker engine + a local registry ----------------------------------------------


def _unavailable(reason: str) -> NoReturn:
    """CI must not go green by skipping: there, a missing engine or registry fails."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def docker_cmd() -> str:
    command = os.environ.get("DOCKER") or "docker"
    try:
        done = subprocess.run(
            [*command.split(), "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"docker is not usable: {exc}")
    if done.returncode != 0:
        _unavailable(f"the Docker engine is unreachable: {done.stderr.strip()[-200:]}")
    return command


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310  (loopback)
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throwaway `docker-registry` on a free loopback port, storage in a temp dir."""
    binary = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    if not Path(binary).exists():
        _unavailable("docker-registry is not installed (apt-get install -y docker-registry)")
    root = tmp_path_factory.mktemp("registry")
    port = _free_port()
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    with (root / "registry.log").open("w") as out:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 30
        while not _answers(f"http://127.0.0.1:{port}/v2/"):
            if proc.poll() is not None or time.monotonic() > deadline:
                _unavailable(
                    f"docker-registry did not start: {(root / 'registry.log').read_text()}"
                )
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def pushtest_image(docker_cmd: str, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """A tiny imported image tagged sm-horovod-pushtest:cpu and :cpu-<sha>; (image, sha, id)."""
    image, sha = "sm-horovod-pushtest", secrets.token_hex(6)
    tarball = tmp_path / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        data = f"push test {sha}\n".encode()
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    docker = docker_cmd.split()
    subprocess.run([*docker, "import", str(tarball), f"{image}:cpu"], check=True, timeout=120)
    subprocess.run([*docker, "tag", f"{image}:cpu", f"{image}:cpu-{sha}"], check=True, timeout=60)
    image_id = subprocess.run(
        [*docker, "image", "inspect", "--format", "{{.Id}}", f"{image}:cpu-{sha}"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    try:
        yield image, sha, image_id
    finally:
        refs = subprocess.run(
            [*docker, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout.split()
        mine = [r for r in refs if image in r and (r.endswith(f":cpu-{sha}") or r.endswith(":cpu"))]
        if mine:
            subprocess.run(
                [*docker, "rmi", "-f", *mine], capture_output=True, timeout=120, check=False
            )


def _pull_id(docker: list[str], ref: str) -> str:
    subprocess.run([*docker, "rmi", ref], capture_output=True, timeout=60, check=False)
    subprocess.run([*docker, "pull", ref], check=True, capture_output=True, timeout=300)
    return subprocess.run(
        [*docker, "image", "inspect", "--format", "{{.Id}}", ref],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()


@pytest.mark.docker(needs_image=False)  # needs the engine, not the sm-horovod image
@pytest.mark.timeout(600)
def test_make_push_to_a_local_registry(
    docker_cmd: str, registry: str, pushtest_image: tuple[str, str, str], tmp_path: Path
) -> None:
    image, sha, image_id = pushtest_image
    env = {**os.environ, "DOCKER": docker_cmd}
    argv = ["push", "--image", image, "--flavor", "cpu", "--registry", registry, "--sha", sha]
    done = subprocess.run(
        [sys.executable, "-m", "launch", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    uri = f"{registry}/{image}:cpu-{sha}"
    assert done.stdout == f"{uri}\n"
    docker = docker_cmd.split()
    assert _pull_id(docker, uri) == image_id
    assert _pull_id(docker, f"{registry}/{image}:cpu") == image_id


@pytest.mark.docker(needs_image=False)  # needs the engine, not the sm-horovod image
@pytest.mark.timeout(600)
def test_ecr_flow_against_a_local_registry(
    docker_cmd: str, registry: str, pushtest_image: tuple[str, str, str], tmp_path: Path
) -> None:
    """The ECR path for real: stubbed ECR hands out a token for the local registry, and the real
    docker logs in (password on stdin), tags, and pushes."""
    image, sha, image_id = pushtest_image
    repository = f"ecr-{sha}/{image}"
    ecr = boto3.client("ecr", region_name="us-east-1")
    docker = Docker(command=docker_cmd, env={"DOCKER_CONFIG": str(tmp_path / "docker-config")})
    with Stubber(ecr) as stub:
        _stub_missing_repo_then_create(
            stub, name=repository, host=registry, immutable=False, endpoint=f"http://{registry}"
        )
        uri = push_mod.push(
            docker=docker, image=image, flavor="cpu", sha=sha, repository=repository, ecr=ecr
        )
        stub.assert_no_pending_responses()
    assert uri == f"{registry}/{repository}:cpu-{sha}"
    auths = json.loads((tmp_path / "docker-config" / "config.json").read_text())["auths"]
    assert registry in auths
    assert _pull_id(docker_cmd.split(), uri) == image_id


@pytest.mark.docker  # the real CPU image, tagged at HEAD by `make build FLAVOR=cpu`
@pytest.mark.timeout(900)
def test_make_push_of_the_cpu_image_to_a_local_registry(docker_cmd: str, registry: str) -> None:
    """The acceptance path itself: `make push FLAVOR=cpu REGISTRY=...` with the image the
    tests run, then a pull of the printed URI gives the same image ID."""
    image = os.environ.get("SM_IMAGE", "sm-horovod:cpu").split(":")[0]
    done = subprocess.run(
        # -s and --no-print-directory: under `make test` this is a sub-make, whose
        # "Entering/Leaving directory" lines would otherwise surround the printed URI.
        ["make", "-s", "--no-print-directory", "push", "FLAVOR=cpu", f"IMAGE={image}",
         f"REGISTRY={registry}", f"DOCKER={docker_cmd}"],
        cwd=REPO, capture_output=True, text=True, timeout=800, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"{registry}/{image}:cpu-"), done.stdout
    uri = done.stdout.strip()
    local_id = subprocess.run(
        [*docker_cmd.split(), "image", "inspect", "--format", "{{.Id}}", f"{image}:cpu"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    assert _pull_id(docker_cmd.split(), uri) == local_id
