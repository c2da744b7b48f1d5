"""The run's state: the settings every entry point shares, building a loader, live stages, checkpoints."""
