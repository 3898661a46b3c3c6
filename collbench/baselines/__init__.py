"""A cluster's own latency as the reference, and regressions against it: the baseline file format
and the verdict rule, shared by `collbench baseline`, the exporter and `collbench diagnose`.

Python API (for the exporter's baseline series and the regression alert rule):

    from collbench.baselines import load_baseline, regression_bound_us, DEFAULT_THRESHOLD, DEFAULT_K
    b = load_baseline("weekly")                 # or a path ending in .json; UserError if bad
    for e in b.sorted_entries():
        e.key.labels()      # {op, size, size_bytes, nodes, ranks, transport, engine, algorithm}
        e.median_us         # baseline median of latency_avg_us
        e.sigma_us          # its robust sigma (1.4826 x MAD of the runs)
        e.slowest_us        # its slowest run
        e.n                 # runs behind it
        e.regression_bound_us(DEFAULT_THRESHOLD, DEFAULT_K)   # comparison.regression_bound_us of the three

    b.entries[key_of(checked_result_record)]    # the entry a live result compares with

baseline_file  the file format, save/load (untrusted), Collector of measurements
comparison     the verdict rule (regression / noisy / ok / improved / new / missing)
"""

from collbench.baselines.baseline_file import Baseline, BaselineKey, Entry, key_of, list_baselines, resolve_path
from collbench.baselines.comparison import (DEFAULT_K, DEFAULT_THRESHOLD, compare, regression_bound_us,
                                           verdict)


def load_baseline(name_or_path, state_dir=None):
    """The Baseline saved under NAME in state_dir (default: the default config's state_dir), or
    at a path ending in .json. UserError (exit 2) when missing or malformed."""
    from collbench.baselines.baseline_file import load
    if state_dir is None:
        from collbench.config import default_state_dir
        state_dir = default_state_dir()
    return load(name_or_path, state_dir)


__all__ = ["Baseline", "BaselineKey", "Entry", "key_of", "list_baselines", "resolve_path", "DEFAULT_K",
           "DEFAULT_THRESHOLD", "compare", "regression_bound_us", "verdict", "load_baseline"]
