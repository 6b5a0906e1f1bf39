"""Generated Clover checkpoints for tests and benchmarks."""
