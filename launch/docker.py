"""A thin, logged wrapper around the docker CLI (imperative shell)."""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from launch.errors import LaunchError

log = logging.getLogger(__name__)


def default_docker() -> str:
    """The docker command: $DOCKER, else `docker` on PATH."""
    return os.environ.get("DOCKER") or "docker"


@dataclass(frozen=True)
class Docker:
    """Runs `docker ...` with an explicit child environment.

    `env` holds the changes to the parent's environment (for example DOCKER_CONFIG); the child
    gets a copy of os.environ with those applied.
    """

    command: str = "docker"
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 1800.0

    def _child_env(self) -> dict[str, str]:
        child = dict(os.environ)
        child.update(self.env)
        return child

    def run(
        self, args: Sequence[str], *, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run `docker ARGS`; stdin (a secret, say) is passed on the pipe, never on argv."""
        argv = [*shlex.split(self.command), *args]
        log.info("$ %s", shlex.join(argv))
        try:
            done = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                env=self._child_env(),
                check=False,
                timeout=self.timeout,
            )
        except FileNotFoundError as exc:
            raise LaunchError(f"docker command not found: {self.command!r} (set --docker)") from exc
        except subprocess.TimeoutExpired as exc:
            raise LaunchError(f"{shlex.join(argv)} timed out after {self.timeout:.0f}s") from exc
        if check and done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            reason = lines[-1] if lines else f"exit status {done.returncode}"
            raise LaunchError(f"{shlex.join(argv)} failed: {reason}")
        return done

    def image_id(self, ref: str) -> str | None:
        """The local image ID of `ref`, or None if there is no such local image."""
        done = self.run(["image", "inspect", "--format", "{{.Id}}", ref], check=False)
        return done.stdout.strip() if done.returncode == 0 else None

    def login(self, *, server: str, username: str, password: str) -> None:
        """`docker login --username U --password-stdin SERVER`; the password goes on stdin."""
        self.run(["login", "--username", username, "--password-stdin", server], stdin=password)
