"""The periodic jobs on one APScheduler (``maintenance.py``: the reclaim sweep and ``add_job``),
the stall watchdog, the memory trim, and the demo load the server sends itself."""
