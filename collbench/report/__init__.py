"""`collbench report`: results files -> one self-contained HTML page with plots (cli.py).

aggregate       records -> series, points (medians per series/op/size), failures
peak            the point-to-point peak: topo measure matrix, a given number, or measured now
figures         per-op plot data (chart.Figure)
chart           plot model and its hand-written SVG;  chart_png: the same via matplotlib
html_report     the page;  markdown_table: the all-gather guide's results table

Its input files are read by collbench.results.file_reader (untrusted JSONL in, checked records
out, bad lines counted; also used by baseline); the shared pieces it uses sit below the verbs:
collbench.stats (median / quartiles / MAD), collbench.harness (the peak test: once's plan, run in process)
and collbench.pair_matrix (topo measure's matrix files, for --peak-from).
"""
