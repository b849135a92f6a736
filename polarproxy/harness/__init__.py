"""Running a harness around the proxy: `record`, harness presets, the child process, the one SDK environment."""
