"""asyncrl.transport."""
