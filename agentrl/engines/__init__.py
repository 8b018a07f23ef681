"""agentrl.engines."""
