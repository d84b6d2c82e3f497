"""Placeholder: replaced by the process runner in the foundation issue."""
