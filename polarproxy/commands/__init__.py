"""CLI commands that live in their own modules; `polarproxy/cli.py` registers them. Imports stay light."""
