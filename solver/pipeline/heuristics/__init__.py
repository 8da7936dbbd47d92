"""Fast planners: contiguous baselines, SliceGraph, PopRT auto-sharding, manual sharding."""
