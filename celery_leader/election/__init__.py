"""Who leads: the elector, what it tells and who listens, and this process's leases.

It imports nothing itself: the store layer imports :mod:`.timing`.
"""
