"""Klear-Reasoner post-training pipeline: one sub-package per stage, plus shared code in `common`."""
