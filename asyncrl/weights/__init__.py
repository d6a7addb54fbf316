"""asyncrl.weights: the weight broadcast from the trainer to the generation servers: its wire format (buckets) and protocol (sync)."""
