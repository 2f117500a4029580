"""lm-evaluation-harness against servedeck (issue 25): run with ``python -m bench.lm_eval.run``.

Nothing in the project imports this folder, and nothing here imports ``lm_eval``: the
harness runs as a command in a venv of its own (``venv.sh``), and the runner reads its files.
"""
