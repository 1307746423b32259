"""A service we run as a child process with its log in a file (Kubo's daemon, a cluster
peer): whether it runs, SIGKILL, SIGTERM, the graceful stop and the log's tail, once."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

from .._closing import Closing


class ChildProcess(Closing):
    """The process half of ``KuboDaemon`` and ``ClusterPeer``; each says where its log is
    (``log_path``) and what else ``stop()`` removes."""

    _proc: subprocess.Popen[bytes] | None = None
    _log: Any = None

    @property
    def log_path(self) -> Path:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the process at once (a crash: it says nothing to anyone); ``stop()``
        still cleans up."""
        if self.running:
            assert self._proc is not None
            self._proc.kill()
            self._proc.wait()

    def terminate(self) -> None:
        """Ask the process to shut down (SIGTERM) without waiting; ``stop()`` waits."""
        if self.running:
            assert self._proc is not None
            self._proc.send_signal(signal.SIGTERM)

    def _end(self, grace: float) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; close the log."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _tail(self, lines: int = 20) -> str:
        """The log's last ``lines`` lines, for an error that says why it did not start."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.strip().splitlines()[-lines:])
