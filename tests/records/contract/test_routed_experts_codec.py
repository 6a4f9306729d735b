"""`records.contract.RoutedExperts`: the ``.npy`` codec written without NumPy, held to NumPy's own
``save`` and ``load`` (every dtype an engine writes, empty and 64-layer top-8 shapes), and the rows
of a chain's calls placed at their starts."""

from __future__ import annotations

import io

import numpy
import pytest

from records.contract import RoutedExperts, RoutedExpertsProblem
from records.contract.reading import MISSING_ROUTE, aligned_routed_experts


@pytest.mark.parametrize("dtype", ["u1", "<u2", "<i4", "i1", "<i2"])
@pytest.mark.parametrize("shape", [(0, 2, 2), (1, 1, 1), (17, 5, 3), (40, 64, 8)])
def test_the_codec_reads_and_writes_what_numpy_does(dtype, shape):
    array = (numpy.arange(int(numpy.prod(shape))) % 120).astype(dtype).reshape(shape)
    buffer = io.BytesIO()
    numpy.save(buffer, array, allow_pickle=False)
    rows = RoutedExperts.from_npy(buffer.getvalue(), start=3)
    assert rows.to_npy() == buffer.getvalue(), "byte for byte numpy.save's"
    assert numpy.array_equal(rows.to_numpy(), array) and rows.tolist() == array.tolist()
    assert numpy.array_equal(numpy.load(io.BytesIO(rows.from_row(2).to_npy())), array[2:])
    assert rows.from_row(2).start == 3 + min(2, shape[0]), "clamped to the rows there are"


def test_what_is_not_an_integer_array_in_c_order_is_refused():
    for array in (numpy.zeros((2, 2, 2), dtype="<f4"), numpy.asfortranarray(numpy.zeros((2, 3, 4), dtype="u1")),
                  numpy.zeros((2, 2), dtype="u1")):
        buffer = io.BytesIO()
        numpy.save(buffer, array, allow_pickle=False)
        with pytest.raises(RoutedExpertsProblem):
            RoutedExperts.from_npy(buffer.getvalue())
    with pytest.raises(RoutedExpertsProblem, match="not base64"):
        RoutedExperts.from_base64("***")
    with pytest.raises(RoutedExpertsProblem, match="bytes"):
        RoutedExperts("|u1", (2, 1, 1), b"\x01")


def test_a_chains_rows_are_placed_at_their_starts_and_gaps_hold_the_sentinel():
    whole = (numpy.arange(9 * 2 * 2) % 200).astype("u1").reshape(9, 2, 2)

    def part(first: int, last: int) -> RoutedExperts:
        return RoutedExperts("|u1", (last - first, 2, 2), whole[first:last].tobytes(), first)

    joined = aligned_routed_experts([part(0, 4), None, part(4, 9)], tokens=10)
    assert joined is not None and joined.dtype == "|u1" and numpy.array_equal(joined.to_numpy(), whole)
    gap = aligned_routed_experts([part(0, 3), part(5, 9)], tokens=10)
    assert gap is not None and gap.dtype == "<i4"
    expected = whole.astype("<i4")
    expected[3:5] = MISSING_ROUTE
    assert numpy.array_equal(gap.to_numpy(), expected)
    assert aligned_routed_experts([None], tokens=10) is None
