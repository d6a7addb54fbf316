"""Kubeflow Pipelines definitions of asyncrl and their compiled YAML."""
