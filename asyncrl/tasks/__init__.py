"""asyncrl.tasks."""
