"""Arrow arrays from buffers: the same arrays `pa.array` builds from the same values."""

import numpy as np
import pyarrow as pa
import pytest

from klear.curate.arrays import bool_array, int64_array, text_array, text_list_array


@pytest.mark.parametrize("arrow_type", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
def test_text_arrays_equal_pa_array(arrow_type: pa.DataType) -> None:
    values = ["", "plain", "déjà vu", "Σσ ﬁ", "x" * 1000]
    given = values if arrow_type in (pa.string(), pa.large_string()) else [v.encode() for v in values]
    built = text_array(given, arrow_type)
    built.validate(full=True)
    assert built.type == arrow_type and built.equals(pa.array(given, type=arrow_type))
    assert text_array([], arrow_type).equals(pa.array([], type=arrow_type))
    # str and its UTF-8 bytes give the same text array.
    assert text_array([v.encode() for v in values]).equals(text_array(values))


def test_number_bool_and_list_arrays_equal_pa_array() -> None:
    assert int64_array([5, -1, 0]).equals(pa.array([5, -1, 0], pa.int64()))
    assert int64_array(np.arange(3, dtype=np.int32)).equals(pa.array([0, 1, 2], pa.int64()))
    mask = np.array([True, False, True] * 7)
    assert bool_array(mask).equals(pa.array(mask.tolist()))
    lists = [["a", "bé"], [], ["c"]]
    built = text_list_array(lists)
    built.validate(full=True)
    assert built.equals(pa.array(lists, pa.list_(pa.string())))
    assert text_list_array([]).equals(pa.array([], pa.list_(pa.string())))
