"""Stage 3: long-CoT SFT on TRL + DeepSpeed ZeRO-3."""
