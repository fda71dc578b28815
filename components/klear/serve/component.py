"""KFP component of the serve step: the recipe's final model behind an OpenAI-compatible endpoint (KServe).

A thin wrapper: the model's manifest is checked (a published model folder, or the step fails before it changes
anything in the cluster), the InferenceService is built by klear.serve.manifest (the chart's `serving` values render
the same object) and applied by klear.serve.deploy, which waits until it serves. The pod's service account needs the
chart's Role (rbac.create: create, patch and get InferenceServices).
"""

from kfp import dsl
from kfp.dsl import Input, Model

from klear.common.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def deploy_model(
    model: Input[Model],
    name: str,
    server_image: str,
    fetch_image: str,
    gpus: str,
    cpu: str,
    memory: str,
    node_selector: dict = {},
    tolerations: list = [],
    s3_secret: str = "klear-s3",
    ready_timeout_s: int = 3600,
) -> str:
    """Create or replace the KServe InferenceService `name` serving `model` with vLLM's OpenAI server; wait until it
    is ready and return its OpenAI base URL inside the cluster (http://<name>-predictor.<namespace>.svc.cluster.local/v1).

    Args:
        model: the published model folder to serve (a sft or gppo output); only the files its manifest lists are
            copied to the server, each checked against its sha256.
        name: the InferenceService's name, and the model name requests give (`--served-model` of `klear evaluate`).
        server_image: the image of the server container: the project's GPU image (vLLM), as compiled.
        fetch_image: the image of the init container that copies the model: the project's CPU image.
        gpus: GPUs of the server pod; vLLM's tensor parallelism spans them.
        cpu: CPU of the server pod.
        memory: memory of the server pod.
        node_selector: node labels the server pod must match (the pipeline's GPU node selector).
        tolerations: tolerations of the server pod (the pipeline's GPU tolerations).
        s3_secret: the Secret with the S3 credentials the copy reads (the chart's, `klear-s3`).
        ready_timeout_s: how long to wait for the server to answer before the step fails.
    """
    import logging

    from klear.common import kfp_io, storage
    from klear.serve.deploy import KServeApi, deploy, pod_namespace
    from klear.serve.fetch import check_model_listing
    from klear.serve.manifest import endpoint_url, inference_service, pipeline_spec

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uri = kfp_io.input_location(model)
    check_model_listing(storage.read_manifest(uri).files, uri)  # before the cluster changes
    spec = pipeline_spec(uri, name, gpus, cpu, memory, node_selector, tolerations, server_image, fetch_image, s3_secret)
    namespace = pod_namespace()
    url = deploy(KServeApi(namespace), inference_service(spec), ready_timeout_s)
    endpoint = endpoint_url(name, namespace)
    logging.getLogger("klear.serve").info("serving %s as %s at %s (KServe: %s)", uri, name, endpoint, url)
    return endpoint
