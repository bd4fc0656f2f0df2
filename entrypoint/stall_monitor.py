"""The stall rule's shell (stall.py is the rule): the master applies it to every host's ranks;
each worker reports its own over the channel and writes its ranks' stacks when asked.

Master: every CHECK_INTERVAL_S, the rule over its own samples and the workers' latest reports
(aged since they came). A suspected stall must hold for CONFIRM_S (a report interval and a
little), with a report from every worker that came since it was suspected, before the master
asks every host for its ranks' stacks at once (the workers' and its own in parallel; each host
writes them into its own log) and judges with them in hand (stall.py `judge`): a stall fails
the job with a `Stalled` line; a job in which a rank works while the others wait is healthy,
and is not suspected again for a timeout.
Worker: a RankReport every REPORT_INTERVAL_S, and at once when a rank's output ended on an
error line (the master's failure line quotes it); DumpStacks answered with the main threads'
frames.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import Callable

from entrypoint.channel.protocol import (
    REPORT_INTERVAL_S,
    DumpStacks,
    Message,
    RankReport,
    StacksDumped,
)
from entrypoint.channel.session import Handlers, Session
from entrypoint.host.activity import HostWatch
from entrypoint.stall import (
    Frame,
    Stall,
    Verdict,
    find_stall,
    healthy_message,
    judge,
    roles_line,
    stall_message,
)
from smcommon.failure import Failure, Reason

log = logging.getLogger("entrypoint")

CHECK_INTERVAL_S = 1.0
CONFIRM_S = REPORT_INTERVAL_S + 1.0
# How long the master waits for the workers' stacks (py-spy on every rank in parallel, bounded
# by its 10 s; the ranks' own dumps by 3 s).
STACKS_TIMEOUT_S = 20.0
# The stacks are read on a suspicion, before the verdict (a healthy job has them in its log too).
SUSPECTED_WHY = "a suspected stall"
GRACE_WHY = "still running when the stop's grace ran out"

# The master's channel: ask a worker (MasterChannel.request).
Ask = Callable[[str, Message, float], Message]


class MasterStalls:
    """The master's side: the rule over the job, then the stacks and the failure."""

    def __init__(
        self,
        watch: HostWatch,
        timeout_s: float,
        *,
        workers: tuple[str, ...] = (),
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.watch = watch
        self._timeout_s = timeout_s
        self._workers = workers
        self._ask: Ask | None = None
        self._wall = wall
        self._next_check = 0.0
        self._since: float | None = None
        # After a healthy verdict: not suspected again before this.
        self._quiet_until = 0.0

    def handlers(self) -> Handlers:
        return {RankReport: self._on_report}

    def attach(self, ask: Ask) -> None:
        """The channel is open: the workers can be asked for their stacks."""
        self._ask = ask

    def _on_report(self, session: Session, report: RankReport) -> None:
        samples = tuple(dataclasses.replace(sample, host=session.peer) for sample in report.samples)
        self.watch.on_report(session.peer, samples, report.errors)

    def check(self, now: float) -> Failure | None:
        """The job's failure once it has stalled (confirmed), else None."""
        if self._timeout_s <= 0 or now < self._next_check or now < self._quiet_until:
            return None
        self._next_check = now + CHECK_INTERVAL_S
        if not self.watch.reported(self._workers):
            return None
        stall = find_stall(self.watch.job_samples(), self._timeout_s)
        if stall is None:
            self._since = None
            return None
        if self._since is None:
            self._since = now
            log.warning(
                "no rank wrote output for %.0f s and %s stopped progressing: confirming",
                stall.quiet_s,
                ", ".join(sample.name for sample in stall.stuck),
            )
        if now - self._since < CONFIRM_S or not self.watch.reported(self._workers, self._since):
            return None
        self._since = None
        verdict = self._judge(stall)
        log.info("every rank: %s", roles_line(verdict))
        if not verdict.stalled:
            log.warning("%s", healthy_message(verdict))
            self._quiet_until = now + self._timeout_s
            return None
        message = stall_message(verdict, self._wall(), self._timeout_s)
        log.error("the job stalled: %s", message)
        # "(on <host>)": the first named rank's host, as for a rank's own failure.
        return Failure(Reason.STALLED, message, verdict.named[0].sample.host)

    def _judge(self, stall: Stall) -> Verdict:
        # The samples of the quiet time, taken before the stacks: a rank that writes its own
        # stack does storage I/O, which must not read as its progress.
        samples = self.watch.job_samples()
        log.warning("reading every rank's stack on every host")
        stacks = self._every_stack(SUSPECTED_WHY)
        return judge(samples, stacks, self._timeout_s, stall.quiet_s)

    def _every_stack(self, why: str) -> dict[str, tuple[Frame, ...]]:
        """Every host's stacks at once: the workers asked first, this host's read meanwhile."""
        ask = self._ask
        workers = self._workers if ask is not None else ()
        found: dict[str, tuple[Frame, ...]] = {}
        with concurrent.futures.ThreadPoolExecutor(max(1, min(len(workers), 32))) as pool:
            answers = {
                host: pool.submit(ask, host, DumpStacks(why), STACKS_TIMEOUT_S)
                for host in workers
                if ask is not None
            }
            found.update(self.watch.dump_stacks(why))
            for host, answer in answers.items():
                try:
                    response = answer.result()
                except Exception as error:  # noqa: BLE001 - a host that cannot answer is named
                    log.warning("no stacks from %s: %s", host, error)
                    continue
                if isinstance(response, StacksDumped):
                    found.update(response.stacks)
        return found

    def grace_expired(self) -> None:
        """Ranks still alive when the stop's grace ran out: every host writes their stacks."""
        self._every_stack(GRACE_WHY)


class WorkerStalls:
    """A worker's side: its reports, and its stacks on the master's request."""

    def __init__(self, watch: HostWatch) -> None:
        self.watch = watch
        self._send: Callable[[Message], None] | None = None
        self._next_report = 0.0

    def attach(self, send: Callable[[Message], None]) -> None:
        """The channel to the master (a message sent while unconnected is dropped)."""
        self._send = send

    def handlers(self) -> Handlers:
        return {DumpStacks: self._on_dump_stacks}

    def _on_dump_stacks(self, _session: Session, request: DumpStacks) -> asyncio.Future[Message]:
        def dump() -> Message:
            return StacksDumped(tuple(self.watch.dump_stacks(request.why).items()))

        return asyncio.get_running_loop().run_in_executor(None, dump)

    def tick(self, now: float) -> None:
        """Report when it is time, or at once when a rank's output ended on an error."""
        if self._send is None:
            return
        errors = self.watch.take_unsent_errors()
        if not errors and now < self._next_report:
            return
        self._next_report = now + REPORT_INTERVAL_S
        self._send(
            RankReport(
                tuple(self.watch.samples()), tuple((error.label, error.line) for error in errors)
            )
        )

    def grace_expired(self) -> None:
        self.watch.dump_stacks(GRACE_WHY)
