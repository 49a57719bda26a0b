"""Worker processes running tests/apps/history_app.py, shared by the fault tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import wait_for

APP = Path(__file__).parent / "apps" / "history_app.py"


class AppWorker:
    """One worker process of the history app; its log in ``tmp_path/<name>.log``."""

    def __init__(self, url: str, history: Path, log: Path, **options):
        self.log_path = log
        self._log = open(log, "wb")
        env = dict(
            os.environ,
            CORRAL_STORE=url,
            HISTORY_LOG=str(history),
            WORKER_OPTIONS=json.dumps(options),
            PYTHONPATH=os.pathsep.join(sys.path),
        )
        self.proc = subprocess.Popen([sys.executable, str(APP)], env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.pid = str(self.proc.pid)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30) -> None:
        wait_for(lambda: "worker ready" in self.log or self.proc.poll() is not None, timeout=timeout)
        assert "worker ready" in self.log, self.log

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def close(self) -> None:
        self.kill()
        self._log.close()
