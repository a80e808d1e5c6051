"""The cache and the decorator."""

import functools
from collections import OrderedDict, namedtuple

Stats = namedtuple("Stats", "hits misses evictions size capacity")

_MISSING = object()


class LRUCache:
    """A mapping of at most ``capacity`` entries; adding to a full cache evicts the entry that
    was used least recently (read with :meth:`get` or written with :meth:`put`)."""

    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._data = OrderedDict()
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    def get(self, key, default=None):
        """The value of ``key``, or ``default``; counts a hit or a miss."""
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            self._misses += 1
            return default
        self._hits += 1
        self._data.move_to_end(key)
        return value

    def put(self, key, value):
        """Store ``value`` under ``key``, evicting the least recently used entry when full."""
        if key in self._data:
            # Replacing a value does not grow the cache: nothing needs to go.
            self._data[key] = value
            self._data.move_to_end(key)
            return
        if len(self._data) >= self.capacity:
            self._data.popitem(last=False)
            self._evictions += 1
        self._data[key] = value

    def pop(self, key, default=None):
        """Remove ``key`` and return its value (``default`` when absent)."""
        return self._data.pop(key, default)

    def clear(self):
        """Remove every entry; the statistics stay."""
        self._data.clear()

    def keys(self):
        """The keys, least recently used first."""
        return list(self._data)

    def stats(self):
        return Stats(self._hits, self._misses, self._evictions, len(self._data), self.capacity)

    def __contains__(self, key):
        # A membership test is not a use: it does not change the order.
        return key in self._data

    def __len__(self):
        return len(self._data)


def memoize(capacity=128):
    """Cache a function's results by its positional arguments in an :class:`LRUCache`."""

    def decorate(function):
        cache = LRUCache(capacity)

        @functools.wraps(function)
        def wrapper(*args):
            result = cache.get(args, _MISSING)
            if result is _MISSING:
                result = function(*args)
                cache.put(args, result)
            return result

        wrapper.cache = cache
        return wrapper

    return decorate
