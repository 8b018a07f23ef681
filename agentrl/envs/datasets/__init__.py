"""Datasets as environments: a prompt per row, scored by reward functions over its columns."""
