"""torch.distributed's launch (Backend.TORCH_DISTRIBUTED): torchrun on every host starts and
watches this host's ranks over a static rendezvous at the master; its part is ProgramPart
(program.py), pausing torchrun on a stop while its ranks get the grace."""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.host.ranks import RANK_SHIM
from entrypoint.job import HostProcess, JobShape, ProcessesLaunch, VerdictRule

# torchrun's static rendezvous: the master host's torchrun serves its TCPStore on this port.
# torchrun's own default, and clear of every other port the entry point uses: 22 (sshd),
# coordination.CHANNEL_PORT (22000) and tf_config.DEFAULT_PORTS (2222-2224).
TORCHRUN_MASTER_PORT = 29500
# How often torchrun looks at its ranks: a rank's exit ends torchrun's part within this.
_TORCHRUN_MONITOR_INTERVAL_S = "0.5"


def torchrun_argv(shape: JobShape) -> list[str]:
    """This host's torchrun: a static rendezvous at the master (node rank = the host's place in
    the sorted host list, as SM_HOSTS orders it), no restarts (a failure is the job's, decided
    over the channel), and the program's whole command line (`--no-python`), so a .py, a .sh
    and an executable run alike."""
    return [
        "torchrun",
        "--nnodes", str(len(shape.hosts)),
        "--nproc-per-node", str(shape.ranks_per_host),
        "--node-rank", str(shape.hosts.index(shape.current_host)),
        "--rdzv-backend", "static",
        "--master-addr", shape.master_host,
        "--master-port", str(TORCHRUN_MASTER_PORT),
        "--max-restarts", "0",
        "--monitor-interval", _TORCHRUN_MONITOR_INTERVAL_S,
        "--no-python",
        # Each rank registers with this host's entry point, which owns it (ranks.py).
        RANK_SHIM,
        *shape.program_argv,
    ]  # fmt: skip


def torchrun_launch(shape: JobShape, env: Mapping[str, str]) -> ProcessesLaunch:
    """Backend.TORCH_DISTRIBUTED: torchrun on every host starts and watches this host's ranks;
    every host reports torchrun's exit and any failure fails the job."""
    process = HostProcess(
        tuple(torchrun_argv(shape)), env, shape.working_dir, supervises_ranks=True
    )
    return ProcessesLaunch((process,), VerdictRule.EVERY_HOST)
