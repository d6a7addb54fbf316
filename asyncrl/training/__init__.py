"""asyncrl.training."""
