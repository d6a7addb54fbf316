"""asyncrl.local."""
