"""Arrow arrays built straight from their buffers.

`pa.array` on a Python list (or a numpy array) imports pandas the first time it runs, to ask whether the
values are a pandas object: a fixed 0.3-0.8 s that curate, which never touches pandas, would pay on every run
(before forking its workers, or in each of them). These build the same arrays from buffers, which asks nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

_INT32_MAX = 2**31 - 1
_STRING = pa.string()


def text_array(values: Sequence[str | bytes], type: pa.DataType = _STRING) -> pa.Array:
    """`values` (str or UTF-8 bytes, no None) as an Arrow array of `type`: string, large_string, binary or
    large_binary. Bytes go in unvalidated: callers hand UTF-8 for the text types."""
    encoded = [v.encode() if isinstance(v, str) else v for v in values]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    large = pa.large_binary()
    array = pa.Array.from_buffers(large, len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])
    if type in (pa.binary(), pa.string()) and offsets[-1] <= _INT32_MAX:
        narrow = pa.Array.from_buffers(pa.binary(), len(encoded),
                                       [None, pa.py_buffer(offsets.astype(np.int32)), array.buffers()[2]])
        return narrow.view(type)
    if type in (pa.large_binary(), pa.large_string()):
        return array.view(type)
    return array.cast(type)  # string or binary past 2 GiB: Arrow says so


def int64_array(values: Sequence[int] | np.ndarray) -> pa.Array:
    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def bool_array(values: np.ndarray) -> pa.Array:
    bits = np.packbits(np.asarray(values, dtype=bool), bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])


def text_list_array(values: Sequence[Sequence[str]]) -> pa.Array:
    """Lists of strings (list<string>), none of them None."""
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, values), dtype=np.int32, count=len(values)), out=offsets[1:])
    flat = text_array([v for vs in values for v in vs])
    return pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), len(offsets), [None, pa.py_buffer(offsets)]), flat)
