"""Capture: the proxy path. The mitmproxy addon, the gateway that serves calls from the backend, the one
assembly of both (stack.py) that mitmdump, `record`, `serve`, `rollout` and Ray nodes use, and intercept mode."""
