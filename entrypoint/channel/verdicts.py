"""The channel's liveness and verdict rules, pure: which peers are silent or suspect, and the
job's verdict from the hosts' exits (and the faults the workers reported)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from entrypoint.channel.protocol import Exited, Verdict
from smcommon.failure import STOPPED_EXIT_CODE, Failure, Reason


def silent_peers(last_heard: Mapping[str, float], now: float, lost_after_s: float) -> list[str]:
    """Peers not heard from for `lost_after_s` (a host cut off the network sends no FIN)."""
    return sorted(host for host, heard in last_heard.items() if now - heard >= lost_after_s)


def suspect_peers(silences: Mapping[str, float], suspect_after_s: float) -> list[str]:
    """Peers silent for `suspect_after_s` or more, most silent first: not lost on silence alone,
    but the explanation when something else failed at the same time (mpirun lost a daemon)."""
    suspects = [host for host, silent in silences.items() if silent >= suspect_after_s]
    return sorted(suspects, key=lambda host: (-silences[host], host))


def first_decisive(
    codes: Mapping[str, int | None], order: Sequence[str], chief: str | None = None
) -> tuple[str | None, int] | None:
    """The rule shared by a host's tasks and by the job's hosts: the first failure in `order`
    decides (name, code); else the chief ending with 0 is success (None, 0); else everyone ending
    with 0 is; else nothing is decided yet (None)."""
    for name in order:
        code = codes.get(name)
        if code is not None and code != 0:
            return name, code
    if chief is not None and codes.get(chief) == 0:
        return None, 0
    if all(codes.get(name) == 0 for name in order):
        return None, 0
    return None


def host_verdict(
    hosts: tuple[str, ...],
    exits: Mapping[str, Exited],
    *,
    chief: str | None = None,
    stopping: bool = False,
) -> Verdict | None:
    """Where every host reports how its part ended. None while undecided.

    - Stopping (SIGTERM): every part gets its grace period to checkpoint, so nothing is decided
      before every host's part ended; then the job was stopped (143), whatever the codes.
    - Otherwise the first failure (in host order) fails the job at once, with that host's
      failure; success needs every host's part to have ended with 0, or, with a `chief`,
      the chief host's part (tf.distribute's parameter servers: the worker and ps servers block
      in server.join() forever and are stopped by the entry points).
    """
    if stopping:
        if all(host in exits for host in hosts):
            return Verdict(STOPPED_EXIT_CODE, Failure(Reason.STOPPED, "stopped by SIGTERM"))
        return None
    codes = {host: result.exit_code for host, result in exits.items()}
    decisive = first_decisive(codes, hosts, chief)
    if decisive is None:
        return None
    host, code = decisive
    if host is None:
        return Verdict(0)
    failure = exits[host].failure or Failure(
        Reason.TRAINING_FAILED, f"the program exited with code {code}", host
    )
    return Verdict(code, failure)


def with_fault(failure: Failure, faults: Mapping[str, Failure], order: Sequence[str]) -> Failure:
    """The job's failure, explained by a fault a host saw (the kernel's OOM killer) where there
    is one: the first in `order` (host order), followed by what the launcher saw of it. A stop
    stays a stop, and a failure that is already a fault stays as it is."""
    if failure.reason in (Reason.STOPPED, Reason.OUT_OF_MEMORY) or not faults:
        return failure
    host = next((host for host in order if host in faults), next(iter(faults)))
    fault = faults[host]
    return dataclasses.replace(fault, message=f"{fault.message}; then: {failure.message}")
