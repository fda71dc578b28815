"""Upload the compiled pipelines in a folder to KFP: a new pipeline when its name is new, else a new version.

    python upload_pipelines.py --host URL --folder DIR --version NAME [--namespace NS]

Run by the chart's upload Job in the CPU image, whose /opt/klear/pipelines/compiled holds the pipelines compiled
for that image's registry and tag. Idempotent: a version name that a pipeline already has is skipped, so a rerun of
the Job (helm upgrade with the same tag) changes nothing. In multi-user Kubeflow the Job authenticates with its
projected service-account token (audience pipelines.kubeflow.org), which kfp's client reads when the file exists.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

TOKEN = "/var/run/secrets/kubeflow/pipelines/token"


def _by_name(name: str) -> str:
    return json.dumps({"predicates": [{"operation": "EQUALS", "key": "display_name", "stringValue": name}]})


def pipeline_name(path: Path) -> str:
    """The name the compiler gave the pipeline (the UI's pipeline name)."""
    return next(yaml.safe_load_all(path.read_text()))["pipelineInfo"]["name"]


def find_pipeline(client: Any, name: str, namespace: str | None) -> str | None:
    found = client.list_pipelines(filter=_by_name(name), namespace=namespace, page_size=2).pipelines or []
    if len(found) > 1:
        raise SystemExit(f"{len(found)} pipelines are named {name!r}: rename or delete the extras")
    return found[0].pipeline_id if found else None


def has_version(client: Any, pipeline_id: str, version: str) -> bool:
    return bool(client.list_pipeline_versions(pipeline_id=pipeline_id, filter=_by_name(version),
                                              page_size=1).pipeline_versions)


def upload_all(client: Any, folder: Path, version: str, namespace: str | None = None) -> list[str]:
    """Upload every *.yaml of `folder`; returns one line per pipeline saying what was done."""
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise SystemExit(f"no compiled pipelines in {folder}")
    done = []
    for path in files:
        name = pipeline_name(path)
        pipeline_id = find_pipeline(client, name, namespace)
        if pipeline_id is None:
            client.upload_pipeline(str(path), pipeline_name=name, description=f"klear {version}", namespace=namespace)
            done.append(f"{name}: new pipeline")
        elif has_version(client, pipeline_id, version):
            done.append(f"{name}: version {version} already there")
        else:
            client.upload_pipeline_version(str(path), pipeline_version_name=version, pipeline_id=pipeline_id)
            done.append(f"{name}: new version {version}")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", required=True)
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--namespace", default="", help="upload as namespaced pipelines of this namespace")
    args = parser.parse_args(argv)

    import kfp
    from kfp.client.set_volume_credentials import ServiceAccountTokenVolumeCredentials

    credentials = ServiceAccountTokenVolumeCredentials(TOKEN) if os.path.exists(TOKEN) else None
    client = kfp.Client(host=args.host, credentials=credentials)
    for line in upload_all(client, args.folder, args.version, args.namespace or None):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
