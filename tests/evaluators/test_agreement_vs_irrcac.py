"""Agreement coefficients against irrCAC, the Python port of Gwet's own irrCAC package.

irrCAC rounds its estimates (4-5 decimals), hence the tolerance."""

import numpy as np
import pandas as pd
import pytest

from biaslab.evaluators.stats import fleiss_kappa, gwet_ac1

irrcac = pytest.importorskip("irrCAC.raw", reason="installed by `make test` as a reference")


def _matrices():
    rng = np.random.default_rng(11)
    yield np.array([[1, 1]] * 118 + [[1, 0]] * 5 + [[0, 1]] * 2)  # the high-agreement paradox
    for raters, categories, agree in ((2, 2, 0.8), (3, 3, 0.6), (5, 4, 0.5), (7, 5, 0.3)):
        base = rng.integers(0, categories, size=60)
        X = np.column_stack([np.where(rng.random(60) < agree, base,
                                      rng.integers(0, categories, size=60))
                             for _ in range(raters)])
        yield X


@pytest.mark.parametrize("ratings", list(_matrices()), ids=lambda m: f"{m.shape[1]}raters")
def test_gwet_ac1_and_fleiss_kappa_match_irrcac(ratings):
    cac = irrcac.CAC(pd.DataFrame(ratings))
    assert gwet_ac1(ratings) == pytest.approx(cac.gwet()["est"]["coefficient_value"], abs=1e-4)
    assert fleiss_kappa(ratings) == pytest.approx(cac.fleiss()["est"]["coefficient_value"],
                                                  abs=1e-4)
