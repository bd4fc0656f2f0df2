"""The scratch space of one benchmark run: the code folder every container mounts at
/opt/ml/code (the timed programs, a throwaway ssh identity and the `train` stand-in for the
toolkit), per-cluster /opt/ml trees, the digits data set. Deleted at the end of the run."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.cluster import docker_command

log = logging.getLogger(__name__)

PROGRAMS = Path(__file__).parent / "programs"
# Inside the containers: the code folder, where the ssh identity and the stand-in live in it.
CODE_MOUNT = "/opt/ml/code"
KEYS_SUBDIR = ".bench-ssh"
BIN_SUBDIR = "bench-bin"
# PATH for containers whose `train` is the stand-in (the image's PATH with the stand-in first).
STAND_IN_PATH = (
    f"{CODE_MOUNT}/{BIN_SUBDIR}:/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
    ":/sbin:/bin"
)

# `train` as an AWS Deep Learning Container has it: the toolkit, with passwordless root ssh
# between the hosts already set up (DLCs bake a key pair; here it is this run's throwaway one).
# The image's sshd and ssh read their keys from /run/sm-horovod/ssh (docker/sshd_config,
# docker/ssh_config); the toolkit's paramiko probe reads ~/.ssh. BENCH_MODE=sshd serves ssh
# only, for the bare-mpirun floor.
STAND_IN = f"""#!/bin/sh
# Written by bench/workspace.py for one benchmark run; not part of the image.
set -eu
keys={CODE_MOUNT}/{KEYS_SUBDIR}
install -d -m 700 /run/sm-horovod/ssh /root/.ssh
for name in id_ed25519 authorized_keys ssh_host_ed25519_key; do
    install -m 600 "$keys/$name" "/run/sm-horovod/ssh/$name"
done
install -m 644 "$keys/known_hosts" /run/sm-horovod/ssh/known_hosts
install -m 600 "$keys/id_ed25519" /root/.ssh/id_ed25519
case "${{BENCH_MODE:-}}" in
    toolkit) exec python -m sagemaker_training.cli.train ;;
    sshd) /usr/sbin/sshd; exec sleep infinity ;;
    *) echo "train stand-in: BENCH_MODE must be toolkit or sshd" >&2; exit 64 ;;
esac
"""


@dataclasses.dataclass(frozen=True)
class Workspace:
    root: Path
    docker: str
    image: str

    @property
    def code_dir(self) -> Path:
        return self.root / "code"

    def cluster_root(self, name: str) -> Path:
        path = self.root / "clusters" / name
        path.mkdir(parents=True)
        return path


def _keygen(folder: Path, name: str, docker: str, image: str) -> None:
    argv = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"bench-{name}"]
    if shutil.which("ssh-keygen"):
        subprocess.run([*argv, "-f", str(folder / name)], check=True, capture_output=True)
        return
    # No OpenSSH on this machine: the image has it.
    docker_command(
        docker, "run", "--rm", "--volume", f"{folder}:/keys", image, *argv, "-f", f"/keys/{name}"
    )


def write_code_dir(code_dir: Path, docker: str, image: str) -> None:
    for program in PROGRAMS.glob("*.py"):
        shutil.copy2(program, code_dir / program.name)
    keys = code_dir / KEYS_SUBDIR
    keys.mkdir(mode=0o700)
    _keygen(keys, "id_ed25519", docker, image)
    _keygen(keys, "ssh_host_ed25519_key", docker, image)
    (keys / "authorized_keys").write_text((keys / "id_ed25519.pub").read_text())
    host_key = " ".join((keys / "ssh_host_ed25519_key.pub").read_text().split()[:2])
    (keys / "known_hosts").write_text(f"* {host_key}\n")
    stand_in = code_dir / BIN_SUBDIR / "train"
    stand_in.parent.mkdir()
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)


@contextmanager
def workspace(docker: str, image: str, keep: bool = False) -> Iterator[Workspace]:
    root = Path(tempfile.mkdtemp(prefix="sm-horovod-bench-"))
    try:
        space = Workspace(root=root, docker=docker, image=image)
        space.code_dir.mkdir()
        write_code_dir(space.code_dir, docker, image)
        yield space
    finally:
        if keep:
            log.info("kept the scratch space %s", root)
        else:
            shutil.rmtree(root, ignore_errors=True)
