"""Ordered groups: helpers that need no store.

A hot group (one customer with 80% of the work) serialises
everything behind one lane. When order only matters within a narrower key
(one order id inside a merchant), spread the group over ``n`` sub-groups: the
same sub-key always lands in the same sub-group, so its order still holds.
"""

from __future__ import annotations

import zlib


def subgroup(group: str, subkey: str, n: int) -> str:
    """The sub-group of ``group`` that ``subkey`` belongs to, stable across processes."""
    if n <= 1:
        return group
    return f"{group}#{zlib.crc32(subkey.encode()) % n}"
