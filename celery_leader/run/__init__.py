"""``leader run``: any command as a fenced singleton."""
