"""Trace files round-trip: reading what `write_trace` wrote gives back the records, as CSV and as JSON lines."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.bench.traces import TraceRecord, read_trace, write_trace

# Any single-line text: the csv module quotes commas, quotes and leading spaces; control characters are not names.
names = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=30)
finite = st.floats(allow_nan=False, allow_infinity=False)
maybe_float = st.none() | finite
counts = st.integers(0, 10**12)
hashes = st.tuples() | st.lists(st.text("0123456789abcdef", min_size=1, max_size=16), max_size=6).map(tuple)

records = st.builds(
    TraceRecord,
    timestamp=finite,
    model=names,
    input_tokens=counts,
    output_tokens=counts,
    temperature=maybe_float,
    top_p=maybe_float,
    max_tokens=st.none() | counts,
    e2e_s=maybe_float,
    ttft_s=maybe_float,
    reasoning=st.none() | st.booleans(),
    prefix_hashes=hashes,
    session=st.none() | names,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(records, max_size=8), st.sampled_from(["trace.csv", "trace.jsonl"]))
def test_read_of_write_is_the_records_in_time_order(batch: list[TraceRecord], name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        assert write_trace(batch, path) == len(batch)
        # read_trace sorts by timestamp, stably, so ties keep the order they were written in.
        assert read_trace(path) == sorted(batch, key=lambda r: r.timestamp)
