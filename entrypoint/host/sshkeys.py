"""Per-job ssh trust, made when the container starts: no key in the repository or the image.

Every host of a job derives the same two Ed25519 key pairs from one secret:
- the user key: its public half is the only authorized key, so only holders of the secret log in;
- the host key: every host serves it, and known_hosts trusts nothing else, so the master only
  talks to hosts of its own job.
The secret is the launcher's per-job random value (SM_HVD_JOB_SECRET; its old name
SM_HVD_SSH_SEED is still read). Without it the job's own
identity (TRAINING_JOB_ARN, else TRAINING_JOB_NAME) is used, which anyone who can read the job's
description can also derive: weaker, and logged as such.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from smcommon.names import JOB_SECRET_ENV, OLD_JOB_SECRET_ENV

SSH_DIR = Path("/run/sm-horovod/ssh")
_SALT = b"sm-horovod ssh v1"


class SeedSource(enum.Enum):
    """Where the key material came from, strongest first."""

    LAUNCHER_SECRET = JOB_SECRET_ENV
    JOB_ARN = "TRAINING_JOB_ARN"
    JOB_NAME = "TRAINING_JOB_NAME"

    @property
    def is_weak(self) -> bool:
        return self is not SeedSource.LAUNCHER_SECRET

    @property
    def variables(self) -> tuple[str, ...]:
        """The environment variables that carry this source, preferred first."""
        if self is SeedSource.LAUNCHER_SECRET:
            return (JOB_SECRET_ENV, OLD_JOB_SECRET_ENV)
        return (self.value,)


@dataclasses.dataclass(frozen=True)
class SshKeys:
    """OpenSSH-format texts, ready to write."""

    user_private: str
    user_public: str
    host_private: str
    host_public: str

    def __repr__(self) -> str:  # never print private keys by accident
        return f"SshKeys(user_public={self.user_public!r}, host_public={self.host_public!r})"


def choose_seed(env: Mapping[str, str]) -> tuple[SeedSource, bytes] | None:
    """The strongest seed the environment offers, or None where there is none."""
    for source in SeedSource:
        for name in source.variables:
            value = env.get(name, "")
            if value:
                return source, value.encode()
    return None


def _derive_key(seed: bytes, purpose: bytes) -> Ed25519PrivateKey:
    material = HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=purpose).derive(seed)
    return Ed25519PrivateKey.from_private_bytes(material)


def _openssh_texts(key: Ed25519PrivateKey, comment: str) -> tuple[str, str]:
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return private, f"{public} {comment}"


def derive_keys(seed: bytes) -> SshKeys:
    """The job's key pairs: the same on every host for the same seed, unrelated otherwise."""
    user_private, user_public = _openssh_texts(_derive_key(seed, b"user"), "sm-horovod-job")
    host_private, host_public = _openssh_texts(_derive_key(seed, b"host"), "sm-horovod-host")
    return SshKeys(user_private, user_public, host_private, host_public)


def fingerprint(public_line: str) -> str:
    """A short, loggable identifier of a public key (not a secret)."""
    return hashlib.sha256(public_line.split()[1].encode()).hexdigest()[:16]


def install_keys(keys: SshKeys, ssh_dir: Path = SSH_DIR) -> None:
    """Write the files sshd and ssh are configured to read (docker/sshd_config, ssh_config)."""
    ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(ssh_dir, 0o700)
    public_host_key = " ".join(keys.host_public.split()[:2])
    files = {
        "id_ed25519": (keys.user_private, 0o600),
        "id_ed25519.pub": (keys.user_public + "\n", 0o644),
        "authorized_keys": (keys.user_public + "\n", 0o600),
        "ssh_host_ed25519_key": (keys.host_private, 0o600),
        "ssh_host_ed25519_key.pub": (keys.host_public + "\n", 0o644),
        # Any host name, one key: the job's host key is the trust anchor, not the name.
        "known_hosts": (f"* {public_host_key}\n", 0o644),
    }
    for name, (text, mode) in files.items():
        path = ssh_dir / name
        tmp = path.with_name(f".{name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
