"""`collbench doctor`: a verdict per host from its reachability, ports, RoCE settings and latest results."""
