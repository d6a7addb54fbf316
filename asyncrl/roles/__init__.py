"""asyncrl.roles."""
