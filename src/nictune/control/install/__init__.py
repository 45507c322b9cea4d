"""Installing the resident agent as a systemd service, here or over SSH."""
