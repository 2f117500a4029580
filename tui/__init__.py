"""servedeck admin console: a Textual app that watches and steers a server over HTTP only.

Nothing here imports the engine or the control plane, so the console runs on an operator's
laptop against a remote server.
"""
