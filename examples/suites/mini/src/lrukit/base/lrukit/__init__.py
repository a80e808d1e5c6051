"""A least-recently-used cache with statistics and a memoizing decorator."""

from lrukit.cache import LRUCache, Stats, memoize

__all__ = ["LRUCache", "Stats", "memoize"]
__version__ = "0.2.0"
