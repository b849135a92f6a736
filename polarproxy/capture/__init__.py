"""Capture: the mitmproxy addon, the gateway that serves calls from the backend, and `record`."""
