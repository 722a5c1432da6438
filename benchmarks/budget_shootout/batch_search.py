"""batch_search.py — the largest batch whose measured peak fits a budget, in few measurements.

The same search as trainmem's side (shootout.hpp, Search::largest_batch): the peaks of two
small batches a < b give bytes per sequence and a first guess on the straight line through
them; from the guess, steps that double bracket the answer (a batch that fits, one that
does not); bisection closes the bracket. `peak(n)` measures n sequences and returns the
peak bytes, or None when the step could not run at all (the device ran out): that batch
does not fit. No torch here, so the search is tested without it (test_batch_search.py).
"""
import math


def largest_batch(peak, budget, bracket=(4, 8), log=lambda msg: None, label=""):
    """(largest batch whose peak <= budget, its peak); (0, None) when not even one sequence fits."""
    a, b = bracket
    if not 0 < a < b:
        raise ValueError(f"batch_search: bracket {bracket}: two batch sizes, the second larger")
    cache = {}

    def measured(n):
        if n not in cache:
            cache[n] = peak(n)
            p = cache[n]
            log(f"  {label}{n} sequences: " + ("the step failed (out of memory)" if p is None else
                                                f"peak {p / 2**20:.1f} MiB {'fits' if p <= budget else 'does not fit'}"))
        return cache[n]

    def fits(n):
        p = measured(n)
        return p is not None and p <= budget

    pa, pb = measured(a), measured(b)
    if pa is None or pb is None or pb <= pa:  # no line to follow: start from the smaller batch
        guess = a if fits(a) else 1
    else:
        guess = max(1, a + math.floor((budget - pa) / ((pb - pa) / (b - a))))
    lo = hi = 0  # lo fits (0: none known), hi does not (0: none known)
    step = 1  # a good prediction is right or off by one: two probes; a bad one costs twice log2(miss)
    if fits(guess):
        lo = guess
        while not hi:
            if fits(lo + step):
                lo += step
            else:
                hi = lo + step
            step *= 2
    else:
        hi = guess
        while not lo and hi > 1:
            c = max(1, hi - step)
            if fits(c):
                lo = c
            else:
                hi = c
            step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return (lo, cache[lo]) if lo else (0, None)
