"""Helpers shared by test modules (which never import each other): real clients and their runners."""
