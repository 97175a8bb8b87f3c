"""The simulator: the real scheduler on a virtual clock, its model runner replaced by a step-cost
model (`cost.py`), driven by the same workloads as `tailgate bench serve` (`run.py`)."""
