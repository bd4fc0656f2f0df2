"""Signals: SIGTERM (StopTrainingJob, a spot interruption, docker stop) and SIGINT set the stop
event the supervising loops obey; installed before anything slow, so a stop during set-up ends
the host at once (SetupStopped)."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

log = logging.getLogger("entrypoint")


class SetupStopped(BaseException):
    """A stop (SIGTERM, SIGINT) came while this host was still setting up (fetching the user's
    code, installing its requirements.txt): raised in the set-up step itself, so the host ends
    within moments instead of after a download or an install that may take minutes. A
    BaseException, as KeyboardInterrupt is: the steps' own `except Exception` must not swallow
    it as one more error of theirs."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name
        # The host it happened on, once known (the contract names it).
        self.host: str | None = None


class StopHandlers:
    """SIGTERM (StopTrainingJob, spot interruption, docker stop) and SIGINT set `stop`; the
    supervising loops forward it to the ranks and bound the grace period. Installed before
    anything slow: inside `setting_up()` a stop also raises SetupStopped in the step that runs.
    """

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self._interrupt = False
        # Set in the handler itself (a plain attribute: no lock), for setting_up's checks.
        self._requested = False

    def install(self) -> StopHandlers:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        return self

    def _on_signal(self, signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        first = not self._requested
        self._requested = True
        # The event is set from another thread, never here: the handler runs on the main
        # thread between two bytecodes, possibly inside the loops' own `stop.wait()` while it
        # holds the event's lock (a plain Lock: it re-takes it on every 0.1 s timeout), and
        # `stop.set()` here would wait for that lock forever. The helper waits until the main
        # thread let go of it. (A torch job's master hung so in CI: no line after the
        # SIGTERM, killed 40 s later.)
        threading.Thread(
            target=self._stopped, args=(name if first else None,), name="stop", daemon=True
        ).start()
        if self._interrupt:
            # Once: the step's own clean-up (ending pip's group) runs undisturbed.
            self._interrupt = False
            raise SetupStopped(name)

    def _stopped(self, name: str | None) -> None:
        if name is not None:
            log.warning("received %s", name)
        self.stop.set()

    @contextlib.contextmanager
    def setting_up(self) -> Iterator[None]:
        """Set-up steps run inside: a stop before, during or right after them raises
        SetupStopped (nothing of the job has started yet, so there is nothing to forward)."""
        if self._requested or self.stop.is_set():
            raise SetupStopped("SIGTERM")
        self._interrupt = True
        try:
            yield
        finally:
            self._interrupt = False
        if self._requested or self.stop.is_set():
            raise SetupStopped("SIGTERM")


def install_stop_handlers(stop: threading.Event) -> StopHandlers:
    """The stop handlers (StopHandlers), installed."""
    return StopHandlers(stop).install()
