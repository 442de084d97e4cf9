"""The per-worker serving-engine model: engine block names and the step-based EngineWorker."""
