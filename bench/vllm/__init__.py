"""vLLM CPU as a peer on the same real model (issue 26): ``venv.sh`` makes its venv,
``hf_model`` the Hugging Face folder both servers load, ``side_by_side`` runs them one at a time
under vLLM's own ``vllm bench serve``. Nothing here imports vLLM: it runs as commands in its
own venv, and the summary reads the result files they write."""
