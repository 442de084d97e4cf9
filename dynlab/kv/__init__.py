"""KV-cache storage: the block pool with its free queue and prefix cache."""
