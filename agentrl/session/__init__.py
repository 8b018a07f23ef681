"""agentrl.session."""
