"""test_batch_search.py — batch_search.largest_batch against the answer found by trying every batch.

Run: python3 -m unittest discover -s benchmarks/budget_shootout -p 'test_*.py' (scripts/test does).
"""
import unittest

from batch_search import largest_batch


def brute_force(peak, budget, limit=10_000):
    best = 0
    for n in range(1, limit):
        p = peak(n)
        if p is not None and p <= budget:
            best = n
    return best


class LargestBatch(unittest.TestCase):
    def check(self, peak, budget, bracket=(4, 8)):
        calls = []

        def counted(n):
            calls.append(n)
            return peak(n)

        batch, at = largest_batch(counted, budget, bracket)
        self.assertEqual(batch, brute_force(peak, budget), f"budget {budget}")
        self.assertEqual(at, peak(batch) if batch else None)
        self.assertEqual(len(calls), len(set(calls)), "each batch is measured once")
        return calls

    def test_linear_peaks_are_found_in_few_steps(self):
        peak = lambda n: 1000 + 37 * n  # noqa: E731
        for budget in (1000, 1036, 1037, 1100, 5000, 123_456):
            calls = self.check(peak, budget)
            self.assertLessEqual(len(calls), 4, f"budget {budget}: {calls}")

    def test_a_line_that_is_off_still_finds_the_answer(self):
        # Small batches look cheaper per sequence than large ones (a workspace that grows late).
        peak = lambda n: 500 + 10 * n + (0 if n < 20 else 3 * (n - 20) ** 2)  # noqa: E731
        for budget in (600, 800, 1000, 3000, 20_000):
            self.check(peak, budget)

    def test_out_of_memory_counts_as_not_fitting(self):
        peak = lambda n: None if n > 50 else 100 * n  # noqa: E731  (the device runs out past 50)
        for budget in (99, 100, 2_000, 4_999, 5_000, 10**9):
            self.check(peak, budget)

    def test_nothing_fits(self):
        self.assertEqual(largest_batch(lambda n: 10**6 * n, 10), (0, None))
        self.assertEqual(largest_batch(lambda n: None, 10**9), (0, None))

    def test_the_bracket_must_grow(self):
        with self.assertRaises(ValueError):
            largest_batch(lambda n: n, 10, (8, 4))


if __name__ == "__main__":
    unittest.main()
