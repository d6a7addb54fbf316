"""Cluster mode: thin entry points of the Kubeflow pipeline's steps (`setup`, `finalize`: argument parsing, then
`asyncrl.run`), the pipeline and its components (`asyncrl.cluster.pipeline`), `asyncrl pipeline` and the local
rehearsal of the compiled pipeline. Never imports `asyncrl.local`, except the rehearsal runner (its processes and
embedded S3; see tests/unit/test_import_rules.py)."""
