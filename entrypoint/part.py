"""A part: this host's share of the job, as the supervising loops and the channel see it (the
interface every launch's part implements; host/children.py has the child processes they are
made of).

A part owns the processes it starts: it signals the process group it created (each child runs
in its own session) or the ranks that registered with it (host/ranks.py), never a process it
found by name. It also brings what the channel needs from it (message types, handlers, what to
open before the channel and close after), so `supervise.run_host` never asks which launch it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from entrypoint.channel.protocol import CATALOG, Catalog, Message
from entrypoint.channel.session import Handlers
from entrypoint.host.activity import HostWatch
from entrypoint.job import VerdictRule
from smcommon.failure import Failure, Reason

# The master's channel, as a part may use it: ask a worker (MasterChannel.request).
Ask = Callable[[str, Message, float], Message]


class Supervised(Protocol):
    """What the supervising loops see of this host's part."""

    # Who decides the job's outcome (the master's loop reads it).
    verdict: VerdictRule
    # A worker's part starts on the master's Start (else it arrives on its own: orted).
    starts_on_start: bool
    # A worker reports how its part ended (else the master's part knows: mpirun).
    reports_exit: bool

    def ready_workers(self, connected: frozenset[str], now: float) -> frozenset[str]:
        """The master's: of the connected workers, those the part can start on."""

    def start(self) -> None:
        """Start the local processes (a worker's MPI part has none of its own)."""

    def poll(self) -> int | None:
        """The part's exit code once it ended, else None."""

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the training processes, and only to them: they have `grace_s` to
        checkpoint while everything they need (daemons, the channel) stays up."""

    def end(self) -> None:
        """End whatever is left of the part: SIGTERM, then SIGKILL to what it owns."""

    def failure(self, code: int) -> Failure | None:
        """The failure of a part that ended with `code` (None for success), worded by the part:
        how it exited, its last error line, the host where that happened."""

    def settled(self) -> bool:
        """After a stop: no training process of the part is left (a restart waits for this,
        at most the stop's grace, before `end`)."""

    def reset(self, attempt: int) -> None:
        """After `end`: ready to start the same launch again, as attempt `attempt` (its number
        in every rank's environment: restarts.attempt_environment)."""


class LocalPart(Supervised, Protocol):
    """This host's share of the job: what the loops see, and what the channel needs of it."""

    # The channel's message types, the part's own included.
    catalog: Catalog
    # This host's log pump, its ranks' progress and stacks (whatever the launch).
    watch: HostWatch

    def handlers(self) -> Handlers:
        """The part's handlers of channel messages (added to the channel's own)."""

    def prepare(self) -> None:
        """Before the channel opens: what must exist once a worker connects (sshd, sockets)."""

    def attach(self, ask: Ask) -> None:
        """The master's channel is open: the part may ask the workers through it."""

    def close(self) -> None:
        """After the channel closed: release what `prepare` opened."""


class PartBase:
    """The defaults of a part that needs nothing of the channel but its own messages."""

    verdict = VerdictRule.EVERY_HOST
    starts_on_start = True
    reports_exit = True
    catalog: Catalog = CATALOG

    def handlers(self) -> Handlers:
        return {}

    def prepare(self) -> None:
        pass

    def attach(self, ask: Ask) -> None:
        pass

    def ready_workers(self, connected: frozenset[str], now: float) -> frozenset[str]:
        return connected

    def reset(self, attempt: int) -> None:
        pass

    def close(self) -> None:
        pass


def exit_failure(exited: str, error: str | None, host: str | None) -> Failure:
    """A process' failure: how it exited and its last error line, where it happened."""
    message = f"{exited}; last error: {error}" if error else exited
    return Failure(Reason.TRAINING_FAILED, message, host)
