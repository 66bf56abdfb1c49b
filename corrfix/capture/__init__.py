"""Capture of both sides of every proxied connection, plus repair events, as Arrow IPC streams."""
