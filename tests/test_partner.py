"""The simulated partner API that the demo and the limits benchmark run against."""

from __future__ import annotations

import json
import urllib.request

import pytest

from corral.core.retry_after import retry_after
from corral.edges.partner import PartnerHTTPError, PartnerServer, call, max_in_window


def test_max_in_window_counts_the_busiest_sliding_second():
    assert max_in_window([], 1.0) == 0
    assert max_in_window([0.0, 0.5, 0.99, 1.0, 1.5], 1.0) == 3
    assert max_in_window([0.0, 1.0, 2.0], 1.0) == 1


def test_the_partner_refuses_over_its_cap_with_retry_after_and_fails_in_an_outage():
    with PartnerServer(cap=3, latency=0.0) as p:
        answers = []
        for i in range(5):
            try:
                answers.append(call(p.url, f"s{i}")["sku"])
            except PartnerHTTPError as exc:
                answers.append(exc.status_code)
                if exc.status_code == 429:
                    assert retry_after(exc, 0.0) == 1.0
        assert answers[:3] == ["s0", "s1", "s2"] and answers[3:] == [429, 429]
        urllib.request.urlopen(urllib.request.Request(f"{p.url}/outage?seconds=60", method="POST")).read()
        with pytest.raises(PartnerHTTPError) as err:
            call(p.url, "x")
        assert err.value.status_code in (503, 429)
        stats = json.loads(urllib.request.urlopen(f"{p.url}/stats").read())
        assert stats["ok"] == 3 and stats["over_cap"] >= 2 and stats["max_in_any_second"] == 3


def test_the_partner_logs_every_call_and_an_armed_outage_starts_at_the_first_call():
    with PartnerServer(cap=2, latency=0.0) as p:
        p.state.arm_outage(60)
        assert p.state.outage_window is None  # nothing called yet
        for i in range(3):
            with pytest.raises(PartnerHTTPError):
                call(p.url, f"s{i}", worker="w1", claimed=123.5)
        log = p.state.calls_log()
        assert [c.status for c in log] == [503, 503, 503]
        assert [c.sku for c in log] == ["s0", "s1", "s2"]
        assert {(c.worker, c.claimed) for c in log} == {("w1", 123.5)}
        start, end = p.state.outage_window
        assert end - start == pytest.approx(60) and start <= log[0].at
