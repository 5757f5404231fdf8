"""Judges, oracles, metric reducers and statistics. Metrics are plain functions over arrays or
frames with keyword-only ``sensitive_features``; statistics take an explicit ``random_state``."""

from biaslab.evaluators.fairness import (accuracy, demographic_parity_difference,
                                         equalized_odds_difference,
                                         predicted_failure_rate_by_group, roc_auc)
from biaslab.evaluators.judges import (EnsembleVerdict, Verdict, judge, judge_ensemble,
                                       judge_node, regex_oracle)
from biaslab.evaluators.stats import (BootstrapResult, bootstrap, cohens_kappa, fleiss_kappa,
                                      gwet_ac1, paired_bootstrap, two_proportion_ztest)
from biaslab.evaluators.votes import VoteResult, majority_vote

__all__ = ["BootstrapResult", "EnsembleVerdict", "Verdict", "VoteResult", "accuracy",
           "bootstrap", "cohens_kappa", "demographic_parity_difference",
           "equalized_odds_difference", "fleiss_kappa", "gwet_ac1", "judge", "judge_ensemble",
           "judge_node", "majority_vote", "paired_bootstrap", "predicted_failure_rate_by_group",
           "regex_oracle", "roc_auc", "two_proportion_ztest"]
