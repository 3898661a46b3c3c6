"""`collbench locate`: the slow host or link found by group testing and pairwise probes."""
