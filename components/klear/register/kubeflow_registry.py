"""The Kubeflow Model Registry, through its Python client (`model-registry` on PyPI, extra `register`): the model as a
version of a registered model, its artifact the published location (KServe's storage initializer reads s3:// with
the serving account's credentials), format `huggingface` 1, the same tags as MLflow's as custom properties.

The version is named by the content (`<stage>-<digest, 16 hex>`): registering the same content again finds it and adds
nothing. The client reads its bearer token from the file KF_PIPELINES_SA_TOKEN_PATH names, else from the pod's
service account token; the address's scheme says http or https and its port, as the client infers them.
"""

from __future__ import annotations

import logging
from typing import Any

from klear.common import tracking
from klear.common.config import clip
from klear.register.entries import (
    MODEL_FORMAT,
    Evaluation,
    KubeflowRegistration,
    MlflowRegistration,
    PublishedModel,
    RegisterError,
    kubeflow_metadata,
    kubeflow_version,
    version_description,
)

log = logging.getLogger("klear.register")


def _client(address: str, author: str) -> Any:
    try:
        from model_registry import ModelRegistry
    except ImportError as exc:
        raise RegisterError(f"--kubeflow-registry needs the Kubeflow Model Registry client: pip install "
                            f"'klear-pipeline[register]' ({exc})") from None
    try:
        return ModelRegistry(address, author=author)  # port and TLS from the address's scheme
    except Exception as exc:  # noqa: BLE001 - unreachable, refused, no token for https: named, redacted
        raise RegisterError(f"Kubeflow Model Registry at {tracking.redact(address)!r} cannot be used: "
                            f"{clip(tracking.redact(str(exc)), 600)}") from None


def register(address: str, name: str, model: PublishedModel, evaluation: Evaluation | None,
             mlflow: MlflowRegistration | None, author: str) -> KubeflowRegistration:
    """Register `model` as the version of `name` named by its content, unless it is there already."""
    registry = _client(address, author)  # first: it names the client when the package is missing
    from model_registry.exceptions import StoreError

    version = kubeflow_version(model)
    try:
        found = registry.get_model_version(name, version) if registry.get_registered_model(name) else None
        created = found is None
        if created:
            try:
                registry.register_model(name, model.uri, version=version, model_format_name=MODEL_FORMAT[0],
                                        model_format_version=MODEL_FORMAT[1], author=author, owner=author,
                                        version_description=version_description(model.card, model.card_uri),
                                        metadata=kubeflow_metadata(model, evaluation, mlflow))
            except StoreError as exc:  # a registration racing this one made the version first: it is this content
                if "already exists" not in str(exc):
                    raise
                created = False
            found = registry.get_model_version(name, version)
        registered = registry.get_registered_model(name)
    except RegisterError:
        raise
    except Exception as exc:  # noqa: BLE001 - the client's and the server's failures, named and redacted
        raise RegisterError(f"Kubeflow Model Registry at {tracking.redact(address)!r}: {name} {version}: "
                            f"{clip(tracking.redact(str(exc)), 600)}") from None
    if found is None or registered is None:
        raise RegisterError(f"Kubeflow Model Registry at {tracking.redact(address)!r}: {name} {version} is not there "
                            "after registering it")
    log.info("kubeflow: %s version %s (%s)", name, version, "new" if created else "registered before")
    return KubeflowRegistration(address, name, str(registered.id), version, str(found.id), created)
