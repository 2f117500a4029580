"""``servedeck bench``: the article's batching experiments side by side in one process run."""
