"""agentrl.trainer."""
