"""The transitions figure keeps a readable, bounded size however many dialogues it shows: a
paper-scale part (hundreds of dialogues) used to make a PNG thousands of pixels tall."""

import struct

import pandas as pd

from biaslab.experiments.reports.multiturn import plot_transitions


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def _part(n: int) -> pd.DataFrame:
    return pd.DataFrame({"turns": [[{"turn": t, "biased": (i + t) % 3 == 0} for t in (1, 2, 3)]
                                   for i in range(n)]})


def test_a_few_dialogues_get_a_row_each_and_hundreds_share_a_bounded_height(tmp_path):
    heights = {}
    for n in (10, 40, 300, 2000):
        paths = plot_transitions(_part(n), f"{n} dialogues", tmp_path / f"t{n}")
        assert [p.suffix for p in paths] == [".png", ".svg"]
        heights[n] = _png_size(paths[0])[1]
    assert heights[10] < heights[40]  # below the cap the figure grows with its dialogues
    assert heights[300] == heights[2000] <= 12 * 150 + 50  # 12 in at 150 dpi, plus margins
