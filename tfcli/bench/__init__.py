"""Benchmarks: tfcli's speed on this machine, side by side with peers doing the same work, as ratios."""
