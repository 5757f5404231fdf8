"""The Python API for notebooks and scripts: `open_run` and `run`, both returning a `Run`.

``import biaslab`` stays cheap: these names are imported from ``biaslab`` on first use.
"""

from biaslab.api._launch import run
from biaslab.api._results import Run, Tables, open_run

__all__ = ["Run", "Tables", "open_run", "run"]
