"""Tiny Qwen3-style model and tokenizer for the CPU preset."""
