import unittest

from lrukit import LRUCache, memoize


class CacheTests(unittest.TestCase):
    def test_rejects_zero_capacity(self):
        with self.assertRaises(ValueError):
            LRUCache(0)

    def test_put_and_get(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        self.assertEqual(cache.get("a"), 1)
        self.assertIsNone(cache.get("missing"))
        self.assertEqual(cache.get("missing", 0), 0)

    def test_evicts_oldest_write(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.put("c", 3)
        self.assertNotIn("a", cache)
        self.assertEqual(cache.keys(), ["b", "c"])

    def test_get_refreshes_recency(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        self.assertEqual(cache.get("a"), 1)
        cache.put("c", 3)
        self.assertIn("a", cache)
        self.assertNotIn("b", cache)
        self.assertEqual(cache.keys(), ["a", "c"])

    def test_contains_does_not_refresh(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        self.assertIn("a", cache)
        cache.put("c", 3)
        self.assertNotIn("a", cache)

    def test_update_in_full_cache_keeps_other_entries(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.put("b", 20)
        self.assertEqual(cache.get("a"), 1)
        self.assertEqual(cache.get("b"), 20)

    def test_pop_and_clear(self):
        cache = LRUCache(3)
        cache.put("a", 1)
        cache.put("b", 2)
        self.assertEqual(cache.pop("a"), 1)
        self.assertEqual(len(cache), 1)
        cache.clear()
        self.assertEqual(len(cache), 0)


class StatsTests(unittest.TestCase):
    def test_counts_hits_misses_and_evictions(self):
        cache = LRUCache(1)
        cache.put("a", 1)
        cache.get("a")
        cache.get("b")
        cache.put("b", 2)
        stats = cache.stats()
        self.assertEqual((stats.hits, stats.misses, stats.evictions), (1, 1, 1))
        self.assertEqual((stats.size, stats.capacity), (1, 1))

    def test_update_is_not_an_eviction(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.put("a", 10)
        stats = cache.stats()
        self.assertEqual((stats.evictions, stats.size), (0, 2))


class MemoizeTests(unittest.TestCase):
    def test_calls_once_per_argument(self):
        calls = []

        @memoize(capacity=4)
        def square(x):
            calls.append(x)
            return x * x

        self.assertEqual([square(3), square(3), square(4)], [9, 9, 16])
        self.assertEqual(calls, [3, 4])
        self.assertEqual(square.cache.stats().hits, 1)

    def test_keeps_arguments_in_use(self):
        calls = []

        @memoize(capacity=2)
        def double(x):
            calls.append(x)
            return 2 * x

        for x in (1, 2, 1, 3, 1):
            double(x)
        self.assertEqual(calls, [1, 2, 3])


if __name__ == "__main__":
    unittest.main()
