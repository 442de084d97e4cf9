"""Step latency: the LatencyModel interface, the hardware and model catalogue, built-in models."""
