"""An app with periodic tasks, for ``corral periodic APP`` (its store comes from --store)."""

from __future__ import annotations

import corral

app = corral.App()


@app.periodic("*/5 * * * *", name="refresh_prices", queue="prices", overlap=False)
def refresh_prices() -> None:
    pass


@app.task(cron="0 3 * * *")
def nightly_report(ctx) -> None:
    pass
