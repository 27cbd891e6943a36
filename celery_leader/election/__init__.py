"""Who leads: the elector (:mod:`.lease`), its timing (:mod:`.timing`), what it tells
(:mod:`.events`, :mod:`.members`) and what watches it (:mod:`.skew`, :mod:`.foreign`,
:mod:`.outage`), and this process's leases (:mod:`.lease_set`).

Nothing is imported here: the store layer takes :mod:`.timing`'s call deadline,
and the elector imports the store layer.
"""
