"""The app ``corral bench limits`` runs with ``corral worker``.

``corral worker corral.bench.limits_app:app --store URL`` builds it from the
environment: the store from ``$CORRAL_STORE`` (which ``--store`` sets) and
the partner from ``$CORRAL_BENCH_PARTNER_URL``. The limit and the breaker are
not declared here: the benchmark declares them in the store before the
workers start, as an operator would, and every worker reads them there.

Tasks:

- ``limits.sync_sku``: one partner call under the ``partner_api`` limit (the
  rate scenario); a 429 with ``Retry-After`` snoozes it and pauses the limit;
- ``limits.sync_sku_outage``: the same call with retries enough to outlast
  a 20 s outage and a short backoff (the breaker scenario);
- ``limits.sync_sku_adaptive``: the call under the adaptive limit; a 429
  raises ``Retry(after=0.5)`` (a throttle: no attempt burned);
- ``limits.flaky``: 50 ms of work, then a transient error, three retries
  with a short backoff (the retry-path scenario's failing load);
- ``limits.fresh``: 50 ms of work (the retry-path scenario's new arrivals).
"""

from __future__ import annotations

import os
import time

from corral.app import App
from corral.core.retries import Backoff
from corral.edges.fleet import lazy_app
from corral.edges.partner import call
from corral.engine.context import Context

PARTNER_ENV = "CORRAL_BENCH_PARTNER_URL"
LIMIT = "partner_api"
#: what each retry-path task does, in seconds
WORK_S = 0.05
#: a throttled call of the adaptive scenario runs again this much later (s)
ADAPTIVE_RETRY_AFTER = 0.5


class FlakyError(ConnectionError):
    """The retry-path scenario's transient failure (retried with backoff)."""


def _partner_url() -> str:
    url = os.environ.get(PARTNER_ENV)
    if not url:
        raise RuntimeError(f"${PARTNER_ENV} is not set: the partner API's URL")
    return url


def sync_sku(sku: str) -> dict:
    """Fetch one SKU from the partner (the process goes to the partner's log)."""
    return call(_partner_url(), sku, worker=str(os.getpid()))


def sync_sku_outage(ctx: Context, sku: str) -> dict:
    """Fetch one SKU from the partner (retried through an outage).

    The call carries the store's own claim time of this attempt, which the
    benchmark lines up with the breaker's recorded changes (same clock): a
    task handed out while the breaker was OPEN is an attempt burned."""
    claimed = __getattr__("app").get(ctx.task_id).started_at
    return call(_partner_url(), sku, worker=str(os.getpid()), claimed=claimed)


def sync_sku_adaptive(sku: str) -> dict:
    """Fetch one SKU under the adaptive limit: a 429 is a throttle, run
    again shortly (``Retry``: no attempt burned, the limit not paused; the
    controller reads it and cuts the rate)."""
    from corral.edges.partner import PartnerHTTPError
    from corral.errors import Retry

    try:
        return call(_partner_url(), sku, worker=str(os.getpid()))
    except PartnerHTTPError as exc:
        if exc.status_code == 429:
            raise Retry(after=ADAPTIVE_RETRY_AFTER) from None
        raise


def flaky(i: int) -> None:
    """Work a little, then fail (transient)."""
    time.sleep(WORK_S)
    raise FlakyError(f"flaky task {i} failed")


def fresh(i: int) -> None:
    """Work a little."""
    time.sleep(WORK_S)


def build_app(store: str | None = None) -> App:
    """The benchmark's app on ``store`` (default: ``$CORRAL_STORE``)."""
    app = App(store)
    app.task(name="limits.sync_sku", retries=20, limits=[LIMIT], backoff=Backoff(base=0.5, cap=5.0))(sync_sku)
    app.task(
        name="limits.sync_sku_outage",
        retries=1000,
        limits=[LIMIT],
        backoff=Backoff(base=0.5, factor=1.5, cap=2.0, jitter=0.5),
    )(sync_sku_outage)
    app.task(name="limits.sync_sku_adaptive", retries=3, limits=[LIMIT])(sync_sku_adaptive)
    app.task(name="limits.flaky", retries=3, backoff=Backoff(base=0.2, factor=2.0, cap=1.0, jitter=0.5))(flaky)
    app.task(name="limits.fresh")(fresh)
    return app


#: ``app`` is built on first access, so importing this module opens no store.
__getattr__ = lazy_app(build_app)
