"""The decoder for Llama, Mistral, Qwen2 and Qwen3 checkpoints (one decoder, a few switches)
and its loader for Hugging Face folders."""
