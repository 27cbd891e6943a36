"""Who leads: the elector (:mod:`.elector`) and its timing (:mod:`.timing`), what it
tells (:mod:`.events`, :mod:`.members`) and who listens (:mod:`.lease`, :mod:`.skew`,
:mod:`.foreign`), and this process's leases (:mod:`.lease_set`).

It imports nothing itself: the store layer imports :mod:`.timing`, and the
elector imports the store layer.
"""
