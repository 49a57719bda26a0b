"""``corral dashboard``: a live web view of a store, with its actions and /metrics.

Needs the ``dashboard`` extra (Starlette, uvicorn, Jinja2). :func:`serve_background`
runs it in a thread (the demo prints its URL); ``corral dashboard`` runs it in
the foreground. It binds 127.0.0.1 unless told otherwise, and any other
address needs a token (:func:`check_bind`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from corral.edges.dashboard.hosts import is_loopback
from corral.errors import ConfigError
from corral.stores.base import Store

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8484


def check_bind(host: str, token: str | None) -> None:
    """Refuse an address other machines can reach unless a token guards it."""
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"refusing to serve the dashboard on {host}, which other machines can reach, without --token;"
            " give --token, or bind 127.0.0.1"
        )
    if token is not None and len(token) < 8:
        raise ConfigError("the dashboard token must be at least 8 characters")


class BackgroundDashboard:
    """A dashboard served by uvicorn on a daemon thread; ``.url``, ``.stop()``."""

    def __init__(self, server: Any, thread: threading.Thread, url: str):
        self._server = server
        self._thread = thread
        self.url = url

    def stop(self) -> None:
        """Stop serving (open live streams are closed) and wait for the thread."""
        self._server.should_exit = True
        self._thread.join(timeout=15)


def _config(store: Store, host: str, port: int, token: str | None, read_only: bool, log_level: str) -> Any:
    import uvicorn

    from corral.edges.dashboard.app import create_app

    check_bind(host, token)
    app = create_app(store, token=token, read_only=read_only)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=2,
    )


def serve_background(
    store: Store,
    *,
    host: str = DEFAULT_HOST,
    port: int = 0,
    token: str | None = None,
    read_only: bool = False,
) -> BackgroundDashboard:
    """Serve the dashboard of ``store`` from a thread; returns once it listens (port 0: any free one)."""
    import uvicorn

    server = uvicorn.Server(_config(store, host, port, token, read_only, "warning"))
    thread = threading.Thread(target=server.run, name="corral-dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive():
            raise ConfigError(f"the dashboard could not listen on {host}:{port}")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise ConfigError(f"the dashboard did not start listening on {host}:{port} within 30 s")
        time.sleep(0.02)
    sock = server.servers[0].sockets[0]
    bound_port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return BackgroundDashboard(server, thread, f"http://{shown}:{bound_port}")


def serve(
    store: Store,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    read_only: bool = False,
) -> None:
    """Serve in the foreground until interrupted."""
    import uvicorn

    uvicorn.Server(_config(store, host, port, token, read_only, "warning")).run()


__all__ = ["serve_background", "serve", "check_bind", "is_loopback", "BackgroundDashboard"]
