"""A small shop back office on corral: the app behind ``corral worker examples.shop:app``.

Run from the repository root::

    corral worker examples.shop:app --concurrency 8
    corral submit sync_sku '["A1", "tmall"]' --app examples.shop:app --group merchant-1001
    corral status

``corral.App()`` with no URL uses ``$CORRAL_STORE`` (else ``sqlite:///corral.db``),
which is how ``--store`` on the command line reaches this module.
"""

from __future__ import annotations

import time

import corral

app = corral.App()

# Seed 000: the partner API takes 100 QPS at ~200 ms a request, so at most
# 100 x 0.2 x 0.7 = 14 requests in flight (`corral plan --qps 100 --latency-ms 200`).
app.limit("partner_api", concurrency=14)


def _wait(ctx: corral.Context, seconds: float, step: float = 0.05) -> None:
    """Simulated I/O that stays responsive to cancel requests."""
    end = time.monotonic() + seconds
    while True:
        ctx.check_cancelled()
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(step, left))


@app.task(retries=3, timeout=60, limits=["partner_api"])
def sync_sku(ctx: corral.Context, sku_id: str, channel: str, latency: float = 0.05) -> dict:
    """Fetch one SKU's price and stock from a partner channel and save them."""
    ctx.progress(0.1, "fetching detail")
    _wait(ctx, latency)
    ctx.progress(0.6, "fetched detail")
    _wait(ctx, latency / 4)
    ctx.progress(1.0, "saved")
    return {"sku": sku_id, "channel": channel, "price": round(9.9 + len(sku_id) * 1.5, 2)}


@app.task(retries=2, timeout=30)
def notify_merchant(merchant: str, message: str) -> str:
    """Push one notification to a merchant (submit with group=merchant to keep order)."""
    return f"sent to {merchant}: {message}"


@app.task
def check_price(sku_id: str, price: float) -> float:
    """Validate a price; a negative one is a permanent failure (never retried)."""
    if price < 0:
        raise ValueError(f"negative price {price} for {sku_id}")
    return price
