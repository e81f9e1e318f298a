"""A small thread-safe LRU cache with hit/miss counts (the simulator's and the lowerings').

>>> cache = LruCache(2)
>>> cache.get_or_build("a", lambda: 1), cache.get_or_build("a", lambda: 2)
(1, 1)
>>> cache.hits, cache.misses
(1, 1)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable

__all__ = ["LruCache"]


class LruCache:
    """Keeps the ``size`` most recently used values; builds a missing one under the lock."""

    def __init__(self, size: int):
        self.size = size
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.RLock()
        self.hits = 0
        self.misses = 0

    def get_or_build(self, key: Hashable, build: Callable[[], object]):
        with self._lock:
            hit = self._data.get(key)
            if hit is not None:
                self.hits += 1
                self._data.move_to_end(key)
                return hit
            self.misses += 1
            value = self._data[key] = build()
            if len(self._data) > self.size:
                self._data.popitem(last=False)
            return value

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0
