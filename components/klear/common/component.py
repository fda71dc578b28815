"""The content-digest step in front of every cached stage task.

KFP's cache key (on a cluster as in kfp.local) holds an input's URI or artifact, not the bytes behind it, and
stage outputs change in place by design (`sample` tops an output up when n grows). A cached task therefore
takes this step's digest of what its inputs hold as a parameter: same URIs, other content, another key. The
step itself is never cached.
"""

from kfp import dsl

from klear.common.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def digest_inputs(uri: str = "", second_uri: str = "", third_uri: str = "", uris: list = []) -> str:
    """sha256 of the content of the inputs a stage reads: published outputs by their manifests' checksums, S3
    objects by ETag and size, local files by their bytes.

    Args:
        uri: An input (a file, a folder or a published output; s3:// or a path), or "".
        second_uri: Another input, or "".
        third_uri: Another input, or "".
        uris: More inputs (e.g. the benchmark files), each optionally with a `#...` field mapping.
    """
    from klear.common import kfp_io

    return kfp_io.inputs_digest([uri, second_uri, third_uri, *uris])


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def slice_list(count: int) -> list:
    """The slices of a sampling use, ["0/N", ..., "N-1/N"]: what its ParallelFor iterates over (N >= 1).

    Args:
        count: N, the number of slices (pods) to sample in.
    """
    if count < 1:
        raise ValueError(f"slices must be >= 1, got {count}")
    return [f"{index}/{count}" for index in range(count)]
