"""`collbench baseline save|list|show|compare|delete`: the verbs over the shared baseline file
format and verdict rule in collbench.baselines."""
