"""asyncrl.storage: the object store and what lives in it: the S3 client, retries, the run's key layout, group objects and the trainer's read-ahead, checkpoints."""
