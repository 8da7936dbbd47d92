"""Experiments: sweeps of (graph, cluster, method) runs from a YAML config, local or on Ray, and
reports."""
