"""asyncrl: fully asynchronous RL post-training for language models (see README.md)."""
