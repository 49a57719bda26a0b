"""The app of ``corral demo``'s main scenario, as its workers run it.

``corral worker corral.edges.demo_app:app --store URL`` builds it from the
environment: the store from ``$CORRAL_STORE`` (which ``--store`` sets), the
partner from ``$CORRAL_DEMO_PARTNER_URL``, and the file where notification
runs are recorded (for the ordering check) from ``$CORRAL_DEMO_HISTORY``.
The limits and the breaker are not declared here: the demo declares them in
the store before any worker starts, as an operator would, and every worker
reads them there.

Tasks, per SKU:

- ``demo.detail``: fetch the SKU's detail from the partner (under the
  ``partner_api`` limit); a negative price is bad data, refused for good;
- ``demo.images``: fetch its images (same limit), once its detail succeeded;
- ``demo.notify``: tell the merchant, once the images are in; one lane per
  merchant (its group), so a merchant's notifications arrive in order, under
  the ``merchant_push`` limit that all merchants share.
"""

from __future__ import annotations

import os

from corral.app import App
from corral.core.retries import Backoff
from corral.edges.fleet import lazy_app
from corral.edges.partner import call, notify
from corral.engine.context import Context
from corral.testing.history import HistoryLog

PARTNER_ENV = "CORRAL_DEMO_PARTNER_URL"
HISTORY_ENV = "CORRAL_DEMO_HISTORY"
PARTNER_LIMIT = "partner_api"
PUSH_LIMIT = "merchant_push"
DETAIL, IMAGES, NOTIFY = "demo.detail", "demo.images", "demo.notify"
#: transient 503/429 answers retry soon, with jitter; the breaker is what waits out an outage
BACKOFF = Backoff(base=0.25, factor=2.0, cap=2.0, jitter=0.5)


class BadPartnerData(ValueError):
    """The partner sent data that cannot be right: retrying cannot help."""


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"${name} is not set (the demo sets it for its workers)")
    return value


def sync_detail(ctx: Context, sku: str, merchant: str) -> dict:
    """Fetch one SKU's detail and check it."""
    ctx.progress(0.1, "fetching detail")
    detail = call(_env(PARTNER_ENV), sku, worker=str(os.getpid()), headers=ctx.trace_headers())
    if detail["price"] < 0:
        raise BadPartnerData(f"partner sent a negative price ({detail['price']}) for {sku} of {merchant}")
    ctx.progress(1.0, "detail saved")
    return {"sku": sku, "merchant": merchant, "price": detail["price"]}


def sync_images(ctx: Context, sku: str, merchant: str) -> dict:
    """Fetch one SKU's images (its detail is in)."""
    ctx.progress(0.1, "fetching images")
    images = call(_env(PARTNER_ENV), sku, worker=str(os.getpid()), path="/images", headers=ctx.trace_headers())
    ctx.progress(1.0, "images saved")
    return {"sku": sku, "images": len(images["images"])}


def notify_merchant(ctx: Context, merchant: str, seq: int, sku: str) -> None:
    """Push notification ``seq`` to ``merchant``; every run is recorded for the ordering check."""
    history = HistoryLog(_env(HISTORY_ENV))
    history.start(ctx.task_id, ctx.group, lease=str(ctx.attempt), order=None)
    try:
        notify(_env(PARTNER_ENV), merchant, seq)
    finally:
        history.end(ctx.task_id, lease=str(ctx.attempt))


def build_app(store: str | None = None) -> App:
    """The demo's app on ``store`` (default: ``$CORRAL_STORE``)."""
    app = App(store)
    app.task(name=DETAIL, retries=5, timeout=30, limits=[PARTNER_LIMIT], backoff=BACKOFF)(sync_detail)
    app.task(name=IMAGES, retries=5, timeout=30, limits=[PARTNER_LIMIT], backoff=BACKOFF)(sync_images)
    app.task(name=NOTIFY, retries=8, timeout=30, limits=[PUSH_LIMIT], backoff=Backoff(base=0.1, factor=2.0, cap=1.0))(
        notify_merchant
    )
    return app


#: ``app`` is built on first access, so importing this module opens no store.
__getattr__ = lazy_app(build_app)
