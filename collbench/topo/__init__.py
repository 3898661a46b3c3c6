"""Topology-aware rank order: pairwise matrices, outliers, rank mapping, launch files (`collbench topo`).

Modules: `patterns` (the communication
patterns and the cost model an order is judged by), `greedy` (the topology-aware collectives report's two
greedy heuristics, method `greedy`), `exact` (optimal orders for small P), `local_search` (the scalable heuristic),
`mapping` (the methods table and `map_order`), `outliers` (slow hosts and links in a measured
matrix), `heatmap` (PNG/SVG pictures), `order_files` (rankfile, hostfile, machinefile, Slurm
hostfile, config snippet), `cli` (the verb). The matrix file format and its validation is the
shared module collbench.pair_matrix (report --peak-from reads it too). Docs: docs/TOPO.md.
"""
