"""The client's table state (tickwire.clients.state): a state whose row keys have no gaps finds
rows by arithmetic instead of a search, with the same answers and the same refusals."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tickwire.clients.state import TableState
from tickwire.errors import ProtocolError
from tickwire.protocol import barrage
from tickwire.protocol.update import BarrageUpdate

SCHEMA = pa.schema([("K", pa.int64()), ("S", pa.string())])


def _update(*, added=None, removed=None, modified=None, values=None, mod_values=None) -> BarrageUpdate:
    md = barrage.UpdateMetadata(first_seq=1, last_seq=1, added_rows=added, removed_rows=removed,
                                added_rows_included=added,
                                mod_column_nodes=None if modified is None else [modified, modified])
    return BarrageUpdate(md, values or [], mod_values or [])


def _ranges(keys) -> np.ndarray:
    k = np.asarray(keys, dtype=np.int64)
    return np.stack((k, k), axis=1)


def _state(first_key: int, n: int) -> TableState:
    st = TableState(SCHEMA)
    keys = np.arange(first_key, first_key + n, dtype=np.int64)
    st.apply(_update(added=_ranges(keys),
                     values=[pa.array(keys), pa.array([f"s{k}" for k in keys.tolist()])]))
    return st


@pytest.mark.parametrize("first_key", [0, 1000])
def test_modifications_removals_and_appends_of_a_gap_free_state(first_key):
    st = _state(first_key, 10)
    rows = [first_key + 2, first_key + 7]
    st.apply(_update(modified=_ranges(rows), mod_values=[pa.array([-1, -2]), pa.array(["a", "b"])]))
    got = st.to_arrow()
    assert got.column("K").to_pylist()[2] == -1 and got.column("S").to_pylist()[7] == "b"
    # appended after the last key: still without gaps
    st.apply(_update(added=_ranges([first_key + 10]), values=[pa.array([99]), pa.array(["z"])]))
    assert st.keys.tolist() == list(range(first_key, first_key + 11))
    st.apply(_update(removed=_ranges([first_key + 3])))  # now with a gap: found by searching
    st.apply(_update(modified=_ranges([first_key + 4, first_key + 10]),
                     mod_values=[pa.array([7, 8]), pa.array(["x", "y"])]))
    assert st.to_arrow().column("K").to_pylist() == [first_key, first_key + 1, -1, 7, first_key + 5,
                                                      first_key + 6, -2, first_key + 8, first_key + 9, 8]


@pytest.mark.parametrize("rows", [[3, 12], [-1, 2], [12]])
def test_rows_a_gap_free_state_does_not_hold_are_refused(rows):
    st = _state(0, 10)
    with pytest.raises(ProtocolError, match="not held"):
        st.apply(_update(modified=_ranges(rows), mod_values=[pa.array(rows), pa.array(["q"] * len(rows))]))
