"""The control plane's controllers the project relies on: the scheduler, the Job and EndpointSlice controllers."""
