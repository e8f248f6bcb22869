"""`localserve top`, the terminal dashboard. It talks to a server over HTTP
only (`source.HttpSource`) and imports nothing of the engine."""
