"""Stage 2, sampling: n responses per prompt from a model or an OpenAI-compatible endpoint, exactly once."""
