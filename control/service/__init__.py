"""The engine seam: ``protocol.py`` (``EngineService``, what the routes and jobs hold) and
``local.py`` (``LocalEngine``, one engine in this process); the fleet's is
``control/fleet/fleet.py``."""
