"""The worker keeps retries on their own path: every claim it makes carries its
``retry_share`` (0.25 unless told), and CIRCUIT_OPEN's retries-only claims
leave it out (no fresh work is taken then, so retries take every unit)."""

from __future__ import annotations

import pytest

import corral
from corral.core.claims import ClaimRequest
from corral.testing import FakeClock, run_until_idle


def _app_recording_claims(monkeypatch) -> tuple[corral.App, list[dict]]:
    app = corral.App("memory://", clock=FakeClock())

    @app.task
    def ping() -> int:
        return 1

    seen: list[ClaimRequest] = []
    inner = app.store.claim

    def claim(worker_id, request):
        seen.append(request)
        return inner(worker_id, request)

    monkeypatch.setattr(app.store, "claim", claim)
    ping.submit()
    return app, seen


def test_the_worker_claims_with_a_quarter_for_retries_by_default(monkeypatch):
    app, seen = _app_recording_claims(monkeypatch)
    assert [r.status for r in run_until_idle(app)] == [corral.State.SUCCESS]
    assert seen and {r.retry_share for r in seen} == {0.25}


@pytest.mark.parametrize(("share", "sent"), [(0.5, {0.5}), (None, {None})])
def test_the_worker_claims_with_the_share_it_was_given(monkeypatch, share, sent):
    app, seen = _app_recording_claims(monkeypatch)
    worker = app.worker(1, poll_interval=0.01, retry_share=share)
    worker.start()
    try:
        assert worker.drain(timeout=30)
    finally:
        worker.stop(grace=5.0)
    assert seen and {r.retry_share for r in seen} == sent
