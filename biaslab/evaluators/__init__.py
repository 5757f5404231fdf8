"""Judges, oracles, metric reducers and statistics. Metrics are plain functions over arrays or
frames with keyword-only ``sensitive_features``; statistics take an explicit ``random_state``."""

from biaslab.lazy_exports import lazy_exports

# Resolved on first use (PEP 562): importing a protocol's own evaluator module (e.g.
# biaslab.evaluators.augmentation) must not pull in fairlearn, scikit-learn, scipy and
# statsmodels, which every `biaslab` command would otherwise pay for at start-up (~0.6 s).
__getattr__, __dir__ = lazy_exports(__name__, {
    "fairness": ("accuracy", "demographic_parity_difference", "equalized_odds_difference",
                 "predicted_failure_rate_by_group", "roc_auc"),
    "judges": ("EnsembleVerdict", "Verdict", "judge", "judge_ensemble", "judge_node",
               "regex_oracle"),
    "stats": ("BootstrapResult", "bootstrap", "cohens_kappa", "fleiss_kappa", "gwet_ac1",
              "paired_bootstrap", "two_proportion_ztest"),
    "votes": ("VoteResult", "majority_vote"),
})

__all__ = ["BootstrapResult", "EnsembleVerdict", "Verdict", "VoteResult", "accuracy",
           "bootstrap", "cohens_kappa", "demographic_parity_difference",
           "equalized_odds_difference", "fleiss_kappa", "gwet_ac1", "judge", "judge_ensemble",
           "judge_node", "majority_vote", "paired_bootstrap", "predicted_failure_rate_by_group",
           "regex_oracle", "roc_auc", "two_proportion_ztest"]
