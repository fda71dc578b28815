"""The content-digest step in front of every cached stage task.

KFP's cache key (on a cluster as in kfp.local) holds an input's URI or artifact, not the bytes behind it, and
stage outputs change in place by design (`sample` tops an output up when n grows). A cached task therefore
takes this step's digest of what its inputs hold as a parameter: same URIs, other content, another key. The
step itself is never cached.
"""

from kfp import dsl

from klear.common.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def digest_inputs(uri: str = "", second_uri: str = "", third_uri: str = "", uris: list = [],
                  preset: str = "", recompute: str = "") -> str:
    """sha256 of the content of the inputs a stage reads: published outputs by their manifests' checksums, S3
    objects by ETag and size, local files by their bytes; its config file and the files of its `base` chain too.

    Args:
        uri: An input (a file, a folder or a published output; s3:// or a path), or "".
        second_uri: Another input, or "".
        third_uri: Another input, or "".
        uris: More inputs (e.g. the benchmark files), each optionally with a `#...` field mapping.
        preset: The stage's config: a preset name (shipped with the code: nothing to read), a YAML file or URI
            (read, with every file or URI its `base` chain names), or "".
        recompute: The run's recompute text, folded into the digest: a new text gives new cache keys.
    """
    from klear.common import config, kfp_io

    digest = kfp_io.inputs_digest([uri, second_uri, third_uri, *uris, *config.config_files(preset)])
    return kfp_io.content_key({"inputs": digest, "recompute": recompute}) if recompute else digest


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def slice_list(count: int) -> list:
    """The slices of a sampling use, ["0/N", ..., "N-1/N"]: what its ParallelFor iterates over (1 <= N <=
    MAX_SLICES: refused here, before a pod starts, rather than by every slice's `--slice`).

    Args:
        count: N, the number of slices (pods) to sample in.
    """
    from klear.common.slices import MAX_SLICES

    if not 1 <= count <= MAX_SLICES:
        raise ValueError(f"slices must be 1 to {MAX_SLICES}, got {count}")
    return [f"{index}/{count}" for index in range(count)]
