"""The simulated partner API that the demo and the limits benchmark run against."""

from __future__ import annotations

import json
import urllib.request

import pytest

from corral.core.retry_after import retry_after
from corral.edges.partner import PartnerHTTPError, PartnerServer, call, max_in_window, notify


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


def test_a_flaky_partner_fails_a_seeded_share_of_calls_and_flags_bad_data():
    with PartnerServer(cap=1000, latency=0.0, flaky=0.3, bad_skus=frozenset({"bad"}), seed=4) as p:
        answers = []
        for i in range(200):
            try:
                call(p.url, f"s{i}", path="/images" if i % 2 else "/product")
                answers.append(200)
            except PartnerHTTPError as exc:
                answers.append(exc.status_code)
                if exc.status_code == 429:
                    assert retry_after(exc, 0.0) is None, "a flaky 429 is not the cap: no Retry-After"
        assert set(answers) == {200, 503, 429}
        assert p.state.flaky_answers == {503: answers.count(503), 429: answers.count(429)}
        assert p.state.over_cap == 0 and 20 < answers.count(503) + answers.count(429) < 100
        assert p.state.in_flight == 0 and p.state.peak_in_flight >= 1


def test_bad_skus_get_a_negative_price_and_notifications_keep_their_arrival_order():
    with PartnerServer(cap=1000, latency=0.0, bad_skus=frozenset({"bad"})) as p:
        assert call(p.url, "bad")["price"] < 0 and call(p.url, "good")["price"] > 0
        assert call(p.url, "good", path="/images")["images"]
        for merchant, seq in [("m1", 2), ("m2", 1), ("m1", 1), ("m1", 3)]:
            notify(p.url, merchant, seq)
        assert p.state.notifications() == {"m1": [2, 1, 3], "m2": [1]}
        assert p.state.stats()["peak_in_flight"] == 1 and p.state.busiest_second() == 3
