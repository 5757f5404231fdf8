"""The one Markdown writer every report's tables/*.md goes through."""

import math

import pandas as pd

from biaslab.experiments.reports.markdown import to_markdown


def test_cells_are_escaped_rounded_and_nan_is_empty():
    frame = pd.DataFrame({"role": ["a|b", "two\nlines"], "rate": [1 / 3, math.nan],
                          "n": [3, 4]})
    text = to_markdown(frame, index=False)
    assert text.splitlines() == ["| role | rate | n |", "|---|---|---|",
                                 "| a\\|b | 0.3333 | 3 |", "| two lines |  | 4 |"]
    assert to_markdown(frame, index=False, digits=2).splitlines()[2] == "| a\\|b | 0.33 | 3 |"
    assert "0.3333333333333333" in to_markdown(frame, index=False, digits=None)


def test_index_levels_lead_and_multiindex_columns_flatten_without_touching_the_frame():
    columns = pd.MultiIndex.from_tuples([("fbs", "mean"), ("fbs", "std")])
    frame = pd.DataFrame([[0.5, 0.1]], columns=columns,
                         index=pd.MultiIndex.from_tuples([("E2", "judge")],
                                                         names=["pipeline", "target"]))
    lines = to_markdown(frame).splitlines()
    assert lines[0] == "| pipeline | target | fbs / mean | fbs / std |"
    assert lines[2] == "| E2 | judge | 0.5 | 0.1 |"
    to_markdown(frame, index=False)
    assert isinstance(frame.columns, pd.MultiIndex)  # the caller's frame keeps its columns
