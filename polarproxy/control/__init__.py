"""`serve` and its control API: episodes named by keys, rewards, finishes, the trajectory stream."""
