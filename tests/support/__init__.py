"""Helpers shared by tests: real server processes and the like."""
