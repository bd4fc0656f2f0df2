"""The shell pieces every part is made of: a child in its own session, its output copied to ours
with its last error line remembered (and torchrun's failure summary read)."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO

# How long a child gets to exit after SIGTERM in a teardown before its group is killed.
KILL_WAIT_S = 5.0


class OutputTail:
    """Copies a child's output to our stdout line by line and remembers the last lines, so the
    failure file can name the error a rank printed."""

    _MARKERS = ("Error", "error:", "Exception", "FAILED", "Traceback")

    def __init__(self, stream: IO[bytes], keep: int = 200, prefix: bytes = b"") -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=keep)
        # Several processes on one host (a ps, a worker, the chief) share our stdout: each
        # line then says whose it is.
        self._prefix = prefix
        self._thread = threading.Thread(target=self._copy, args=(stream,), daemon=True)
        self._thread.start()

    def _copy(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            os.write(1, self._prefix + raw)
            self._lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
        stream.close()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def error_line(self) -> str | None:
        """The last line that reads like an error, else None; under torchrun, which rank
        failed how, and that rank's own last error line."""
        return torchrun_root_cause(tuple(self._lines), self._MARKERS) or _last_marked(
            self._lines, self._MARKERS
        )


def _last_marked(lines: Iterable[str], markers: Sequence[str]) -> str | None:
    for line in reversed(list(lines)):
        if any(marker in line for marker in markers):
            return line.strip()
    return None


# torchrun's summary of a failed run (torch/distributed/elastic/multiprocessing/errors): a
# "Root Cause (first observed failure):" block with "rank : 1 (local_rank: 1)" and
# "exitcode : 1 (pid: 42)" lines; torchrun itself then exits 1, whatever the rank's code was.
_ROOT_CAUSE = "Root Cause (first observed failure):"
_SUMMARY_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(.+?)\s*$")
# torchrun's own traceback, printed before its summary: the rank's error lines precede it.
_TORCHRUN_TRACEBACK = "Traceback (most recent call last):"  # its first line


def torchrun_root_cause(lines: Sequence[str], markers: Sequence[str]) -> str | None:
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
    rank_error = _last_marked(
        (
            line.removeprefix(rank_prefix).strip()
            for line in lines[: starts[-1]]
            if line.startswith(rank_prefix)
        ),
        markers,
    )
    if rank_error is None:
        # Otherwise the last error line before torchrun's own traceback.
        tracebacks = [
            index for index, line in enumerate(lines[: starts[-1]]) if _TORCHRUN_TRACEBACK in line
        ]
        rank_error = _last_marked(lines[: tracebacks[-1]] if tracebacks else (), markers)
    return f"{summary}: {rank_error}" if rank_error else summary


class ChildProcess:
    """One child in its own session (so its process group is ours to signal), its output copied
    to ours: mpirun, torchrun, a host's program, a tf.distribute task."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None, *, prefix: str = ""
    ) -> None:
        self._argv = list(argv)
        self._env = dict(env)
        self._cwd = cwd
        self._prefix = prefix.encode()
        self._process: subprocess.Popen[bytes] | None = None
        self._tail: OutputTail | None = None

    def start(self) -> None:
        self._process = subprocess.Popen(
            self._argv,
            env=self._env,
            cwd=self._cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert self._process.stdout is not None  # noqa: S101 - Popen with PIPE guarantees it
        self._tail = OutputTail(self._process.stdout, prefix=self._prefix)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def poll(self) -> int | None:
        if self._process is None:
            return None
        code = self._process.poll()
        if code is not None and self._tail is not None:
            self._tail.join(timeout=5)
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

    def end(self, wait_s: float = KILL_WAIT_S) -> None:
        """SIGTERM to the group, `wait_s` for the child, then SIGKILL to the group."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self.signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(wait_s)
        # What is left of the group (children that outlived it) goes too.
        self.signal_group(signal.SIGKILL)
        self._process.wait()

    def error_line(self) -> str | None:
        return self._tail.error_line() if self._tail else None
