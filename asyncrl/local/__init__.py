"""Embedded mode: process supervision on one machine (the launcher loop, the role processes, the embedded
SeaweedFS S3 server). The run's lifecycle (documents, resume, summary, tracking) is `asyncrl.run`'s."""
