"""Sandboxes for model-written code."""
