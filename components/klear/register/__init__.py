"""`klear register`: a published model (an sft or gppo output) into MLflow's Model Registry and, when asked, the
Kubeflow Model Registry, by reference (its published location, never a copy of the weights), with its lineage, its
evaluation scores and its model card; the scores and the evaluation report also go into the training's MLflow run.

    from klear.register.stage import register
    result = register("s3://runs/r1/gppo-code", "klear-reasoner", evaluation="s3://runs/r1/evaluate")

entries.py turns what the manifests hold into registry entries (pure); mlflow_registry.py and kubeflow_registry.py
write them; stage.py reads the published outputs and is the command.
"""
