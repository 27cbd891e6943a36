"""The ``leader_*`` settings: one table (:mod:`.table`) and each consumer's view (:mod:`.views`)."""
