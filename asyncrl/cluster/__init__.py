"""Cluster mode: the steps a Kubeflow pipeline runs around the long-lived roles (setup, finalize)."""
