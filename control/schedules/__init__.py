"""The schedules room: windows as a pure function of (schedules, now) (``windows.py``), rows and
the job (``store.py``), the API views (``views.py``, ``schemas.py``), ``servedeck schedule``
(``cli.py``) and the load probe (``probe.py``)."""
