"""asyncrl.tracking."""
