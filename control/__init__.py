"""Control plane: REST API, policy store, maintenance jobs, metrics and the CLI."""
