"""The shell pieces every part is made of: a child in its own session, its output in this host's
log pump (rank_output.py) as whole tagged lines, its last error line remembered (and torchrun's
failure summary read)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from entrypoint.host import rank_shim
from entrypoint.host.rank_output import OutputPump, Stream, last_error
from entrypoint.host.rank_shim import HEARTBEAT_FD_ENV, STACKS_DIR_ENV

# How long a child gets to exit after SIGTERM in a teardown before its group is killed.
KILL_WAIT_S = 5.0


# torchrun's summary of a failed run (torch/distributed/elastic/multiprocessing/errors): a
# "Root Cause (first observed failure):" block with "rank : 1 (local_rank: 1)" and
# "exitcode : 1 (pid: 42)" lines; torchrun itself then exits 1, whatever the rank's code was.
_ROOT_CAUSE = "Root Cause (first observed failure):"
_SUMMARY_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(.+?)\s*$")
# torchrun's own traceback, printed before its summary: the rank's error lines precede it.
_TORCHRUN_TRACEBACK = "Traceback (most recent call last):"  # its first line


def torchrun_root_cause(lines: Sequence[str]) -> str | None:
    """'rank R (local_rank: L) exited with code C: <the rank's last error line>' from
    torchrun's failure summary, or None where the lines hold none."""
    starts = [index for index, line in enumerate(lines) if _ROOT_CAUSE in line]
    if not starts:
        return None
    fields: dict[str, str] = {}
    for line in lines[starts[-1] + 1 :]:
        match = _SUMMARY_FIELD.match(line)
        if match:
            fields.setdefault(match.group(1), match.group(2))
    if "rank" not in fields:
        return None
    code = fields.get("exitcode", "?").split()[0]
    summary = f"rank {fields['rank']} exited with code {code}"
    # torch prefixes an uncaught exception's lines in a rank with "[rank<R>]: ".
    rank_prefix = f"[rank{fields['rank'].split()[0]}]:"
    rank_error = last_error(
        line.removeprefix(rank_prefix).strip()
        for line in lines[: starts[-1]]
        if line.startswith(rank_prefix)
    )
    if rank_error is None:
        # Otherwise the last error line before torchrun's own traceback.
        tracebacks = [
            index for index, line in enumerate(lines[: starts[-1]]) if _TORCHRUN_TRACEBACK in line
        ]
        rank_error = last_error(lines[: tracebacks[-1]] if tracebacks else ())
    return f"{summary}: {rank_error}" if rank_error else summary


class ChildProcess:
    """One child in its own session (so its process group is ours to signal), its output (stdout
    and stderr, one stream) in this host's pump as `label`'s: mpirun, torchrun, a host's
    program, a tf.distribute task. A child that is a rank of the job itself (`rank`: a program, a
    task; not mpirun or torchrun, whose ranks register on their own) counts for the stall rule
    and gets a heartbeat pipe."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path | None,
        *,
        label: str,
        pump: OutputPump,
        rank: bool = True,
    ) -> None:
        self._argv = list(argv)
        self._env = dict(env)
        self._cwd = cwd
        self._label = label
        self._pump = pump
        self._rank = rank
        self._process: subprocess.Popen[bytes] | None = None
        self._output: Stream | None = None
        # Its output's end waited for once (a grandchild holding the pipe would make every
        # later poll wait again).
        self._output_waited = False

    def start(self) -> None:
        env = dict(self._env)
        beats_read = beats_write = None
        if self._rank:
            beats_read, beats_write = os.pipe()
            env[HEARTBEAT_FD_ENV] = f"{beats_write}:{os.fstat(beats_write).st_ino}"
            env[STACKS_DIR_ENV] = rank_shim.STACKS_DIR
        try:
            self._process = subprocess.Popen(
                self._argv,
                env=env,
                cwd=self._cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=() if beats_write is None else (beats_write,),
            )
        finally:
            if beats_write is not None:
                os.close(beats_write)
        stdout = self._process.stdout
        assert stdout is not None  # noqa: S101 - Popen with PIPE guarantees it
        # The pump owns the descriptor from now on (and closes it at the stream's end).
        fd = os.dup(stdout.fileno())
        stdout.close()
        self._output = self._pump.add(
            fd, self._label, pid=self._process.pid if self._rank else None, beats_fd=beats_read
        )

    def update_env(self, values: Mapping[str, str]) -> None:
        """Variables for its next start (a restart's attempt number)."""
        self._env.update(values)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def poll(self) -> int | None:
        if self._process is None:
            return None
        code = self._process.poll()
        if code is not None and self._output is not None and not self._output_waited:
            # Its last lines read first: the failure may quote them.
            self._output.done.wait(timeout=5)
            self._output_waited = True
        # A child killed by a signal reports -N; a shell would say 128 + N (Horovod's rule).
        return None if code is None else (128 - code if code < 0 else code)

    def signal(self, signum: int) -> None:
        """The child itself (not its group)."""
        if self.running and self._process is not None:
            self._process.send_signal(signum)

    def signal_group(self, signum: int) -> None:
        """Every process of the child's group (its session: what it started and kept)."""
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signum)

    def end(self, wait_s: float = KILL_WAIT_S, *, reap_s: float | None = None) -> None:
        """SIGTERM to the group, `wait_s` for the child (0: none, SIGKILL at once), then
        SIGKILL to the group; then wait for the child to be reaped (up to `reap_s`: a killed
        process no longer matters, and the host's exit need not wait for the kernel)."""
        if self._process is None:
            return
        if self._process.poll() is None and wait_s > 0:
            self.signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(wait_s)
        # What is left of the group (children that outlived it) goes too.
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(reap_s)

    def lines(self) -> tuple[str, ...]:
        """Its own last lines (untagged)."""
        return tuple(self._output.lines) if self._output is not None else ()

    def error_line(self) -> str | None:
        """The last line that reads like an error, else None; under torchrun, which rank
        failed how, and that rank's own last error line (the ranks' lines are this host's)."""
        if self._output is None:
            return None
        return torchrun_root_cause(self._pump.recent()) or self._output.error_line()
