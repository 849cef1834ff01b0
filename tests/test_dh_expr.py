"""Deephaven filter and column-spec strings, evaluated on Arrow data."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from tickwire.server.dh_expr import ExpressionError, parse_column_spec, parse_filter

T = pa.table({"Sym": ["AAPL", "MSFT", None, "GOOG"], "Price": [101.0, 99.5, 200.0, None], "Size": [1, 2, 3, 4]})


def rows(text: str) -> list[int]:
    return T.filter(parse_filter(text, T.schema)).column("Size").to_pylist()


@pytest.mark.parametrize("text, expected", [
    ("Sym = `AAPL`", [1]),
    ("Sym == 'AAPL'", [1]),
    ("Sym != `MSFT`", [1, 3, 4]),            # null-safe: a null Sym is not MSFT
    ("Sym = null", [3]),
    ("Sym != null", [1, 2, 4]),
    ("Price > 100", [1, 3]),                  # a null Price matches no comparison
    ("Price <= 100 || isNull(Price)", [2, 4]),
    ("100 < Price <= 200", [1, 3]),
    ("Price > 100 && Size < 3", [1]),
    ("Price > 100 and Size < 3", [1]),
    ("!isNull(Sym)", [1, 2, 4]),
    ("Sym in `AAPL`, `GOOG`", [1, 4]),
    ("Sym not in `AAPL`", [2, 3, 4]),
    ("Size in 2, 4", [2, 4]),
    ("Size % 2 = 0", [2, 4]),
    ("-Size < -2", [3, 4]),
    ("Size * 2 + 1 = 7", [3]),
    ("Size > 1 && (Sym = `MSFT` || Sym = `GOOG`)", [2, 4]),
])
def test_filters(text, expected):
    assert rows(text) == expected


@pytest.mark.parametrize("text, message", [
    ("Foo > 1", "unknown column 'Foo'"),
    ("Price >", "cannot parse"),
    ("Sym.startsWith(`A`)", "unsupported expression"),
    ("Sym = `AAPL", "unterminated string"),
    ("Foo in 1, 2", "unknown column 'Foo'"),
    ("Size in Price", "must be literals"),
])
def test_bad_filters_say_what_is_wrong(text, message):
    with pytest.raises(ExpressionError, match=message):
        parse_filter(text, T.schema)


def test_column_specs():
    assert parse_column_spec("Sym", T.schema) == ("Sym", None, "Sym")
    assert parse_column_spec("Ticker = Sym", T.schema) == ("Ticker", None, "Sym")
    name, expr, source = parse_column_spec("Notional = Price * Size", T.schema)
    assert name == "Notional" and source is None
    got = ds.dataset(T).to_table(columns={"Notional": expr}).column(0).to_pylist()
    assert got == [101.0, 199.0, 600.0, None]
    for bad, message in (("Nope", "unknown column"), ("X = Nope", "unknown column"), ("1X = Sym", "cannot parse")):
        with pytest.raises(ExpressionError, match=message):
            parse_column_spec(bad, T.schema)
