"""Running the proxy: the app, worker processes, configuration, hot reload, the fleet, limits."""
