"""sft: long-CoT supervised fine-tuning on TRL + DeepSpeed ZeRO-3."""
