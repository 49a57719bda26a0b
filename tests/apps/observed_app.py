"""Task app for the observability tests: a task that logs through ``ctx.log``
and through its own module logger, and fails its first attempt.

Run as ``python -m corral worker tests.apps.observed_app:app --store URL``.
"""

from __future__ import annotations

import logging
import os

import corral

app = corral.App(os.environ.get("CORRAL_STORE"))
own = logging.getLogger("observed.own")


@app.task(retries=1)
def flaky_step(ctx: corral.Context, sku: str) -> str:
    """Log a line each way; fail the first attempt so a retry is logged."""
    ctx.log.info("syncing %s", sku)
    own.info("own logger line for %s", sku)
    if ctx.attempt == 1:
        raise ConnectionError("partner unreachable")
    return sku
