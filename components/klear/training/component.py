"""The sizing step in front of a training stage's KFP task: what the launching pod asks for.

One node: the launching pod trains itself and takes the node's GPUs, CPU and memory. Several nodes: it only
creates and follows a Kubeflow Trainer job whose pods take the GPUs, so it asks for none (else N nodes of
training would hold N + 1 GPU nodes). KFP resolves a pod's resources from string parameters, including an
upstream task's outputs, so the choice is made here at run time.
"""

from typing import NamedTuple

from kfp import dsl

from klear.common.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def launcher_resources(nodes: int, gpus_per_node: str, cpu: str,
                       memory: str) -> NamedTuple("LauncherResources", gpus=str, cpu=str, memory=str):  # type: ignore[valid-type]
    """GPUs, CPU and memory of the pod that launches a training stage.

    Args:
        nodes: Training nodes of the stage.
        gpus_per_node: GPUs per training node (a whole number as a string).
        cpu: CPU per training node.
        memory: Memory per training node.
    """
    from collections import namedtuple

    LauncherResources = namedtuple("LauncherResources", ["gpus", "cpu", "memory"])
    if nodes > 1:
        return LauncherResources("0", "2", "8Gi")  # it creates and follows the job, streams its log
    return LauncherResources(gpus_per_node, cpu, memory)
