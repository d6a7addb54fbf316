"""asyncrl.models."""
