"""The chat room: OpenAI chat bodies (``schemas.py``), the checkpoint's template (``template.py``)
rendered in worker processes (``render.py``), and the hostile-template probe (``probe.py``)."""
