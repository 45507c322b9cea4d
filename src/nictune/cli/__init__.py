"""The command line: thin wrappers over the loader, targets and agent."""
