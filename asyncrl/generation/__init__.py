"""asyncrl.generation."""
