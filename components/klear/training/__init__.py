"""Training plumbing shared by the training stages (sft, gppo): the stage skeleton and its spec (stage.py),
model folders, checkpoints on object storage, launching on CPU, one GPU node or many (Kubeflow Trainer), the
common report parts and the unwrapping of curate's rows. Needs torch (data.py and report.py do not);
`klear.common` does not. Never imports a stage: stages hand their `TrainingStage` in."""
