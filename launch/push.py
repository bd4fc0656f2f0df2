"""`make push`: tag the locally built image and push it to ECR or another registry.

The pure part (`plan_push`, `registry_host`, `decode_ecr_token`) decides names; the shell part
(`ensure_ecr_repository`, `ecr_login`, `push`) talks to ECR through boto3 and to Docker.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from launch.docker import Docker
from launch.errors import LaunchError

log = logging.getLogger(__name__)

FLAVORS: tuple[str, ...] = ("cpu", "gpu", "tf2.21", "tf2.21-cpu")
# ECR repository names: lowercase path components (see CreateRepository's repositoryName).
_REPOSITORY_NAME = re.compile(r"(?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*")
_REGISTRY = re.compile(r"[A-Za-z0-9.-]+(?::[0-9]{1,5})?")
_SHA = re.compile(r"[0-9a-f]{7,40}")


@dataclass(frozen=True)
class Repository:
    """Where the image goes: `uri` is `host[:port]/name`, without a tag."""

    uri: str
    immutable_tags: bool = False


@dataclass(frozen=True)
class PushPlan:
    """The local image to push, the remote references to push it as, and the URI to print."""

    source: str
    moving_source: str
    targets: tuple[str, ...]
    printed_uri: str


@dataclass(frozen=True)
class RegistryLogin:
    server: str
    username: str
    password: str

    def __repr__(self) -> str:  # never show the token
        return f"RegistryLogin(server={self.server!r}, username={self.username!r}, password=***)"


def sha_tag(flavor: str, sha: str) -> str:
    """The immutable tag of one build: `<flavor>-<git sha>`."""
    return f"{flavor}-{sha}"


def check_names(*, image: str, flavor: str, sha: str, repository: str) -> None:
    """Reject names Docker or ECR would reject later, with a one-line message."""
    if flavor not in FLAVORS:
        raise LaunchError(f"flavor must be one of {', '.join(FLAVORS)}, got {flavor!r}")
    if not _SHA.fullmatch(sha):
        raise LaunchError(f"git sha must be 7-40 lowercase hex digits, got {sha!r}")
    if not _REPOSITORY_NAME.fullmatch(image):
        raise LaunchError(f"image name {image!r} is not a valid lowercase repository name")
    if not _REPOSITORY_NAME.fullmatch(repository) or len(repository) > 256:
        raise LaunchError(f"repository name {repository!r} is not a valid ECR repository name")


def registry_repository(*, registry: str, repository: str) -> Repository:
    """The repository in a plain registry given as `host[:port]` (no scheme, no path)."""
    if not _REGISTRY.fullmatch(registry):
        raise LaunchError(f"registry must be host[:port] without scheme or path, got {registry!r}")
    return Repository(uri=f"{registry}/{repository}")


def plan_push(*, image: str, flavor: str, sha: str, repo: Repository) -> PushPlan:
    """Push `IMAGE:FLAVOR-<sha>` as `REPO:FLAVOR-<sha>` and, if tags may move, `REPO:FLAVOR`.

    The printed URI is the sha tag: it names exactly this build, so a training job started from
    it is reproducible. An immutable repository only gets the sha tag (re-pushing the moving
    `FLAVOR` tag would be refused by ECR).
    """
    pinned = f"{repo.uri}:{sha_tag(flavor, sha)}"
    targets = (pinned,) if repo.immutable_tags else (pinned, f"{repo.uri}:{flavor}")
    return PushPlan(
        source=f"{image}:{sha_tag(flavor, sha)}",
        moving_source=f"{image}:{flavor}",
        targets=targets,
        printed_uri=pinned,
    )


def registry_host(proxy_endpoint: str) -> str:
    """`https://123.dkr.ecr.r.amazonaws.com` -> `123.dkr.ecr.r.amazonaws.com`."""
    host = proxy_endpoint.split("://", 1)[-1]
    return host.rstrip("/")


def decode_ecr_token(authorization_token: str) -> tuple[str, str]:
    """ECR's token is base64 `user:password`; return (user, password)."""
    try:
        decoded = base64.b64decode(authorization_token, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise LaunchError("ECR returned an authorization token that is not base64") from exc
    user, sep, password = decoded.partition(":")
    if not sep or not user or not password:
        raise LaunchError("ECR returned an authorization token that is not user:password")
    return user, password


# --- shell ---------------------------------------------------------------------------------


def _is_immutable(mutability: str) -> bool:
    # IMMUTABLE and IMMUTABLE_WITH_EXCLUSION both refuse to overwrite our moving tag.
    return mutability.startswith("IMMUTABLE")


def ensure_ecr_repository(ecr: Any, *, name: str, immutable_tags: bool) -> Repository:
    """Describe the repository; create it (scan on push) if it is missing."""
    try:
        found = ecr.describe_repositories(repositoryNames=[name])["repositories"][0]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "RepositoryNotFoundException":
            raise
    else:
        mutability = found.get("imageTagMutability", "MUTABLE")
        if immutable_tags and not _is_immutable(mutability):
            log.warning(
                "repository %s exists with %s tags; --immutable-tags only applies on creation",
                name,
                mutability,
            )
        log.info("ECR repository %s exists (%s tags)", found["repositoryUri"], mutability)
        return Repository(uri=found["repositoryUri"], immutable_tags=_is_immutable(mutability))
    mutability = "IMMUTABLE" if immutable_tags else "MUTABLE"
    created = ecr.create_repository(
        repositoryName=name,
        imageTagMutability=mutability,
        imageScanningConfiguration={"scanOnPush": True},
    )["repository"]
    log.info(
        "created ECR repository %s (%s tags, scan on push)", created["repositoryUri"], mutability
    )
    return Repository(uri=created["repositoryUri"], immutable_tags=immutable_tags)


def ecr_login(ecr: Any) -> RegistryLogin:
    """A Docker login for the account's ECR registry, from GetAuthorizationToken."""
    data = ecr.get_authorization_token()["authorizationData"][0]
    user, password = decode_ecr_token(data["authorizationToken"])
    return RegistryLogin(
        server=registry_host(data["proxyEndpoint"]), username=user, password=password
    )


def push(
    *,
    docker: Docker,
    image: str,
    flavor: str,
    sha: str,
    repository: str,
    registry: str | None = None,
    ecr: Any = None,
    immutable_tags: bool = False,
) -> str:
    """Tag and push the local build; return the pinned image URI.

    With `registry` (host:port) no ECR call is made and Docker is expected to be logged in
    already (or the registry to need no login). Otherwise `ecr` is a boto3 ECR client.
    """
    check_names(image=image, flavor=flavor, sha=sha, repository=repository)
    if registry is None and ecr is None:
        raise LaunchError("push needs an ECR client or a registry")
    local = f"{image}:{sha_tag(flavor, sha)}"
    source_id = docker.image_id(local)
    if source_id is None:
        raise LaunchError(
            f"local image {local} not found: run `make build FLAVOR={flavor}` at this commit"
        )
    moving_id = docker.image_id(f"{image}:{flavor}")
    if moving_id is not None and moving_id != source_id:
        log.warning("%s:%s is not %s; pushing %s", image, flavor, local, local)

    if registry is not None:
        repo = registry_repository(registry=registry, repository=repository)
    else:
        repo = ensure_ecr_repository(ecr, name=repository, immutable_tags=immutable_tags)
        login = ecr_login(ecr)
        docker.login(server=login.server, username=login.username, password=login.password)

    plan = plan_push(image=image, flavor=flavor, sha=sha, repo=repo)
    if repo.immutable_tags:
        log.info("tags are immutable: pushing only %s", plan.targets[0])
    for target in plan.targets:
        docker.run(["tag", plan.source, target])
    for target in plan.targets:
        docker.run(["push", target])
    return plan.printed_uri


def resolve_ecr_image_uri(ecr: Any, *, repository: str, flavor: str, sha: str) -> str:
    """The pinned URI of an already pushed build; a clear error if it was never pushed."""
    tag = sha_tag(flavor, sha)
    try:
        repo = ecr.describe_repositories(repositoryNames=[repository])["repositories"][0]
        ecr.describe_images(repositoryName=repository, imageIds=[{"imageTag": tag}])
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("RepositoryNotFoundException", "ImageNotFoundException"):
            raise LaunchError(
                f"{repository}:{tag} is not in ECR: run `make push FLAVOR={flavor}` first"
            ) from exc
        raise
    return f"{repo['repositoryUri']}:{tag}"
