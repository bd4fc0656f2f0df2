"""Unit tests of the per-job ssh keys: deterministic per seed, distinct across seeds, valid."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from entrypoint.host.sshkeys import SeedSource, choose_seed, derive_keys, install_keys


def test_seed_preference():
    assert choose_seed({"SM_HVD_SSH_SEED": "s", "TRAINING_JOB_NAME": "j"}) == (
        SeedSource.LAUNCHER_SECRET,
        b"s",
    )
    # The secret's new name wins over its old one.
    assert choose_seed({"SM_HVD_SSH_SEED": "old", "SM_HVD_JOB_SECRET": "new"}) == (
        SeedSource.LAUNCHER_SECRET,
        b"new",
    )
    by_arn = choose_seed({"TRAINING_JOB_ARN": "arn", "TRAINING_JOB_NAME": "j"})
    assert by_arn is not None and by_arn[0] is SeedSource.JOB_ARN
    by_name = choose_seed({"TRAINING_JOB_NAME": "j"})
    assert by_name is not None and by_name[0] is SeedSource.JOB_NAME
    assert choose_seed({"TRAINING_JOB_NAME": ""}) is None
    assert SeedSource.JOB_NAME.is_weak
    assert not SeedSource.LAUNCHER_SECRET.is_weak


def test_same_seed_same_keys_other_seed_other_keys():
    first, again, other = derive_keys(b"job-a"), derive_keys(b"job-a"), derive_keys(b"job-b")
    # The OpenSSH private format carries a random check word, so compare the key halves.
    assert (first.user_public, first.host_public) == (again.user_public, again.host_public)
    assert first.user_public != other.user_public
    assert first.host_public != first.user_public
    assert first.user_public.startswith("ssh-ed25519 ")
    assert "PRIVATE" not in repr(first)


def test_installed_files_are_private_and_valid(tmp_path: Path):
    keys = derive_keys(b"seed")
    install_keys(keys, tmp_path)
    assert (tmp_path / "id_ed25519").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "ssh_host_ed25519_key").stat().st_mode & 0o777 == 0o600
    assert tmp_path.stat().st_mode & 0o777 == 0o700
    known = (tmp_path / "known_hosts").read_text()
    assert known == "* " + " ".join(keys.host_public.split()[:2]) + "\n"
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    derived_public = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(tmp_path / "id_ed25519")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()[:2]
    assert derived_public == keys.user_public.split()[:2]
