"""KFP components of asyncrl: thin container components around the same entrypoints `asyncrl run` starts."""
