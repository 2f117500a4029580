"""The policy room: versions in the store (``store.py``, ``rows.py``), the typed checks of a
change (``checks.py``), the version in force (``in_force.py``), its API bodies (``schemas.py``)
and ``servedeck policy`` (``cli.py``)."""
