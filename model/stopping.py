"""The stop request: SIGTERM (StopTrainingJob, a spot interruption) noted, not acted on.

The handler only records the signal; the training loop decides, together with the other
ranks, at which step everybody stops (see `model.train`).
"""

from __future__ import annotations

import signal
import types

# The exit status of a process killed by SIGTERM (128 + 15), which callers expect; defined once,
# for the entry point too.
from smcommon.names import STOPPED_EXIT_CODE

__all__ = ["STOPPED_EXIT_CODE", "StopRequest"]


class StopRequest:
    """Remembers whether (and which) stop signal arrived."""

    def __init__(self) -> None:
        self._signal: int | None = None

    def install(self, signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)) -> None:
        for signum in signals:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        del frame
        self._signal = signum

    @property
    def requested(self) -> bool:
        return self._signal is not None

    @property
    def signal_name(self) -> str:
        return "" if self._signal is None else signal.Signals(self._signal).name
