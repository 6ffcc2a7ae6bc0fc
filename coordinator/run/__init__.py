"""A run's steps: the runner `run`, `map` and `gpu` share, submission, results."""
