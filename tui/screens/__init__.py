"""Console screens, one per module (the main screen lives with the app in tui/app.py)."""
