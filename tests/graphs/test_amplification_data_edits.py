"""One process, two runs, the data file edited between them (what a notebook does): the second
run must be the run a fresh process makes on the edited file, not the old file's."""

import subprocess
import sys
from pathlib import Path

import biaslab
from support_runs import _tables

SHIPPED = Path(biaslab.__file__).parent / "datasets" / "files" / "student" / "student-mat.csv"


def _edit_keeping_the_size(path: Path) -> None:
    """Swap G3 between 15 failing and 15 passing students (labels and so the stratified split
    change) and the sex of the first 40 rows: the file keeps its exact size, so only its
    content and times say it changed."""
    header, *rows = path.read_text().splitlines()
    cells = [row.split(";") for row in rows]
    failing = [i for i, c in enumerate(cells) if int(c[-1]) < 10][:15]
    passing = [i for i, c in enumerate(cells) if int(c[-1]) >= 10][:15]
    for f, p in zip(failing, passing):
        cells[f][-1], cells[p][-1] = cells[p][-1], cells[f][-1]
    for c in cells[:40]:
        c[1] = '"M"' if c[1] == '"F"' else '"F"'
    before = path.stat().st_size
    path.write_text("\n".join([header, *(";".join(c) for c in cells)]) + "\n")
    assert path.stat().st_size == before


def test_an_edited_data_file_is_read_again_in_the_same_process(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "student-mat.csv").write_bytes(SHIPPED.read_bytes())
    spec = tmp_path / "spec.toml"
    spec.write_text(
        'name = "edits"\nprotocol = "amplification"\n'
        'models = ["scripted:amplification-synthetic"]\n'
        '[run]\nseeds = [42]\nconcurrency = 4\nretry_base_s = 0.0\n'
        '[conditions]\ndirections = ["pro_female"]\n'
        f'[options]\ndatasets = ["math"]\npipelines = ["E2"]\nmax_test = 20\n'
        f'n_resamples = 200\ndata_dir = "{data.as_posix()}"\n')

    before = biaslab.run(spec, out=tmp_path / "before", quiet=True)
    _edit_keeping_the_size(data / "student-mat.csv")
    after = biaslab.run(spec, out=tmp_path / "after", quiet=True)
    fresh = subprocess.run(
        [sys.executable, "-c", "import sys; from biaslab.cli import main; sys.exit(main(sys.argv[1:]))",
         "run", str(spec), "--out", str(tmp_path / "fresh"), "--quiet", "--no-figures"],
        capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0, fresh.stderr

    old, new = _tables(before.path), _tables(after.path)
    assert new == _tables(tmp_path / "fresh")
    # ...and the edit reached the tables at all: another split, other students, another fit.
    for table in ("tables/predictions.csv", "tables/ml_anchor.csv", "tables/table1.csv"):
        assert table in new
    assert old["tables/predictions.csv"] != new["tables/predictions.csv"]
    assert old["tables/ml_anchor.csv"] != new["tables/ml_anchor.csv"]
