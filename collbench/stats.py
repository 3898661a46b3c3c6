"""Robust summaries of repeated measurements: median, quartiles, MAD, and the robust sigma.

Benchmarks repeat: a stress log holds the same (op, size) thousands of times, a baseline N runs.
The median and the median absolute deviation (MAD) do not move when one run hit a noisy
neighbour; 1.4826 x MAD estimates the standard deviation of normally distributed noise.
"""

MAD_TO_SIGMA = 1.4826


def quantile(sorted_values, q):
    """The q-quantile (0..1) of an ascending sequence, linear between closest ranks; None if empty."""
    n = len(sorted_values)
    if n == 0:
        return None
    pos = (n - 1) * q
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def median(values):
    return quantile(sorted(values), 0.5)


def summarize(values):
    """{n, median, q1, q3, mad, sigma, min, max} of a sequence of numbers; None if empty."""
    s = sorted(values)
    if not s:
        return None
    med = quantile(s, 0.5)
    mad = quantile(sorted(abs(v - med) for v in s), 0.5)
    return {"n": len(s), "median": med, "q1": quantile(s, 0.25), "q3": quantile(s, 0.75),
            "mad": mad, "sigma": MAD_TO_SIGMA * mad, "min": s[0], "max": s[-1]}
