"""Llama-family decoder that reads Hugging Face checkpoint folders."""
