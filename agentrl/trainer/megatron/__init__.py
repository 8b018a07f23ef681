"""Megatron training backend (tensor and pipeline parallelism); see backend.py."""
