"""The control plane's controllers the project relies on: the scheduler and the Job controller."""
