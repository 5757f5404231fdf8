"""Build the small BiasLens release under tests/experiments/biaslens_release/ (committed).

Real rows of the authors' release (MIT, see ../shared/data/biaslens/SOURCE.md): a few questions
per attribute × type of two attributes, for three models (two shipped as folders, one from the
four-model tarball), both conditions, all three answer files, with a bank of just those
questions (`bank/`, the shipped layout) so the question ids match. Why questions are chosen
among those on which the three judges disagree somewhere, so the judge configurations differ.

    PYTHONPATH=$PWD .venv/bin/python tests/experiments/make_biaslens_release.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from biaslab.datasets import biaslens as bl
from biaslab.datasets import biaslens_answers as ba
from biaslab.datasets.biaslens_release import release_root

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "biaslens"
OUT = Path(__file__).resolve().parent / "biaslens_release"
MODELS = {"gpt4omini": SHARED, "mistral": SHARED,
          "deepseek": SHARED / "biaslens_answers_4models.tar.xz"}
ATTRIBUTES = ("age", "gender")
PER_TYPE = 4
_LABEL = {v: k for k, v in bl.TYPE_LABELS.items()}


def main() -> None:
    bank = bl.load_questions(attributes=ATTRIBUTES)
    loaded = {(m, c): ba.load_released_answers(release_root(root), m, c, attributes=ATTRIBUTES)
              for m, root in MODELS.items() for c in ba.CONDITIONS}
    every = pd.concat(loaded.values())
    split = every[every["type"] == "why"].assign(
        split=[len(set(j)) > 1 for j in every[every["type"] == "why"]["judges"]])
    disputed = set(split.loc[split["split"], "qid"])
    picked = []
    for (attribute, qtype), part in bank.groupby(["attribute", "type"], sort=True):
        if qtype == "why":
            part = part[part["qid"].isin(disputed)]
        picked.append(part.sample(PER_TYPE, random_state=7).sort_values("qid"))
    chosen = pd.concat(picked)
    if OUT.exists():
        shutil.rmtree(OUT)
    roles = bl.load_roles()
    bl.write_bank(OUT / "bank", {a: [r for r in roles[a] if r in set(chosen["role"])]
                                 for a in ATTRIBUTES}, chosen)
    for (model, condition), frame in loaded.items():
        rows = frame[frame["qid"].isin(set(chosen["qid"]))]
        for sample, part in rows.groupby("sample"):
            for attribute, mine in part.groupby("attribute"):
                path = (OUT / "answers" / condition / model
                        / f"{ba.file_stem(attribute)}_answers_0{sample + 1}.csv")
                path.parent.mkdir(parents=True, exist_ok=True)
                judges = pd.DataFrame(list(mine["judges"]), columns=["LLM 1", "LLM 2", "LLM 3"])
                pd.DataFrame({"Role": mine["role"].to_numpy(),
                              "Question Type": mine["type"].map(_LABEL).to_numpy(),
                              "Question": mine["question"].to_numpy(),
                              "Answer": mine["answer"].to_numpy(),
                              **{c: judges[c].to_numpy() for c in judges},
                              "final": mine["final"].to_numpy()}).to_csv(path, index=False)
    print(f"wrote {OUT}: {len(chosen)} questions x {len(MODELS)} models")


if __name__ == "__main__":
    main()
