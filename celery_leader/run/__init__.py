"""``leader run``: any command as a fenced singleton.

:mod:`.spec` checks the arguments, :mod:`.runner` campaigns and keeps the
command running while it leads, :mod:`.guard` is the process that stops the
command in time, and :mod:`.timing` bounds the grace by the lease.
"""
