"""The image tag's git sha: the one rule the launcher and the Makefile share."""

from __future__ import annotations

import logging
import shlex
import subprocess
from pathlib import Path

from launch.errors import LaunchError

log = logging.getLogger(__name__)

# The Makefile runs the same command: `git rev-parse --short=12 HEAD`.
SHA_LENGTH = 12
GIT_SHA_ARGV: tuple[str, ...] = ("git", "rev-parse", f"--short={SHA_LENGTH}", "HEAD")


def git_sha(*, cwd: Path | None = None) -> str:
    """Return `git rev-parse --short=12 HEAD` in `cwd` (default: the checkout holding launch/)."""
    where = cwd if cwd is not None else Path(__file__).resolve().parent.parent
    log.debug("running %s in %s", shlex.join(GIT_SHA_ARGV), where)
    try:
        done = subprocess.run(
            GIT_SHA_ARGV, cwd=where, capture_output=True, text=True, check=False, timeout=30
        )
    except FileNotFoundError as exc:
        raise LaunchError("git is not installed; pass --sha to name the image tag") from exc
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output"
        raise LaunchError(f"{shlex.join(GIT_SHA_ARGV)} failed in {where}: {reason}")
    return done.stdout.strip()
