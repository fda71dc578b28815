"""Training plumbing shared by the training stages (sft, gppo): model folders, checkpoints on object storage,
launching on CPU, one GPU node or many (Kubeflow Trainer). Needs torch; `klear.common` does not."""
