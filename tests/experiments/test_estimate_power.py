"""`biaslab estimate --power / --mde`, wall time and cost, through the CLI."""

import json
import math
from pathlib import Path

import pytest
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import proportion_effectsize

from biaslab.agents.providers import ModelSpec
from biaslab.cli import main
from biaslab.experiments.planning import LATENCY_BY_PROVIDER

ROOT = Path(__file__).parents[2]
ROLEPLAY = str(ROOT / "experiments" / "roleplay.toml")
BANK_QUESTIONS = 32_864  # the BiasLens bank's size, as the paper states it


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def small_spec(tmp_path, model_table: str = "") -> str:
    """Amplification on the scripted synthetic agent: 3 pipelines, 2 directions, 20 records."""
    path = tmp_path / "spec.toml"
    models = '["m"]' if model_table else '["scripted:amplification-synthetic"]'
    path.write_text(f"""name = "t"
protocol = "amplification"
models = {models}
[run]
seeds = [42]
concurrency = 4
[conditions]
directions = ["pro_female", "pro_male"]
[options]
datasets = ["math"]
max_test = 20
{model_table}
""")
    return str(path)


def test_roleplay_power_gives_each_question_type_its_mde_and_n(capsys):
    code, out, err = run_cli(capsys, "estimate", ROLEPLAY, "--scale", "paper", "--mde", "0.05",
                             "--json")
    assert code == 0, err
    rows = json.loads(out)["power"]
    assert [r["contrast"] for r in rows] == [f"role vs no role, {t} questions"
                                            for t in ("yes_no", "choice", "why")]
    # a question is the unit (its verdict is the majority of its 3 answers): the bank's
    # questions, split by type as the paper counts them, never questions x repeats
    assert [r["n"] for r in rows] == [10_975, 10_917, 10_972]
    assert sum(r["n"] for r in rows) == BANK_QUESTIONS
    need = NormalIndPower().solve_power(proportion_effectsize(0.55, 0.5), nobs1=None,
                                        alpha=0.05, power=0.8, ratio=1)
    for r in rows:
        assert r["design"] == "two_proportions" and r["source"] == "assumed"
        h = proportion_effectsize(0.5 + r["mde"], 0.5)
        assert NormalIndPower().power(h, nobs1=r["n"], alpha=0.05) == pytest.approx(0.8,
                                                                                  abs=1e-4)
        assert r["n_needed"] == math.ceil(need)
    code, out, _ = run_cli(capsys, "estimate", ROLEPLAY, "--scale", "paper", "--power")
    assert code == 0 and out.count("  power, role vs no role") == 3 and "percentage points" in out
    assert out.count("as the report tests it (two-proportion z test, exact power)") == 3


def test_prices_file_gives_the_cost_by_hand(tmp_path, capsys):
    spec = small_spec(tmp_path)
    prices = tmp_path / "prices.toml"
    prices.write_text('["scripted:amplification-synthetic"]\n'
                      'price_in_per_mtok = 2.0\nprice_out_per_mtok = 8.0\n')
    code, out, err = run_cli(capsys, "estimate", spec, "--scale", "paper", "--prices",
                             str(prices), "--json")
    assert code == 0, err
    report = json.loads(out)
    tokens = report["tokens_estimate"]
    # no split from the protocol: a quarter of the tokens priced as output
    assert report["cost"]["total"] == pytest.approx((0.75 * tokens * 2.0 + 0.25 * tokens * 8.0)
                                                    / 1e6, rel=1e-6)
    code, out, _ = run_cli(capsys, "estimate", spec, "--scale", "paper", "--prices",
                           str(prices))
    assert code == 0 and "cost total:" in out


def test_model_table_prices_and_rps_set_cost_and_wall_time(tmp_path, capsys):
    table = """[model_aliases.m]
provider = "scripted"
model = "amplification-synthetic"
rps = 0.5
price_in_per_mtok = 1.0
price_out_per_mtok = 1.0"""
    code, out, err = run_cli(capsys, "estimate", small_spec(tmp_path, table), "--scale",
                             "paper", "--json", "--latency-s", "3")
    assert code == 0, err
    report = json.loads(out)
    calls = report["calls_estimate"]
    # the endpoint's 0.5 rps is slower than 4 concurrent calls of 3 s each
    assert report["wall_time_s"] == pytest.approx(max(calls / 0.5, calls * 3 / 4), abs=1)
    assert report["cost"]["total"] == pytest.approx(report["tokens_estimate"] / 1e6, rel=1e-6)
    # prices are for the estimate only: never part of what is recorded or sent
    spec = ModelSpec(provider="scripted", model="x", price_in_per_mtok=1.0,
                     price_out_per_mtok=2.0)
    assert "price_in_per_mtok" not in spec.public()
    assert spec.public() == ModelSpec(provider="scripted", model="x").public()


def test_amplification_fbs_power_from_stated_sds(tmp_path, capsys):
    code, out, err = run_cli(capsys, "estimate", small_spec(tmp_path), "--scale", "paper",
                             "--power", "--sd", "0.4", "--json")
    assert code == 0, err
    (row,) = json.loads(out)["power"]
    n_f, n_m = row["n"], row["n_other"]
    assert n_f + n_m == 20 and row["per"] == "model and seed"
    z = 1.959964 + 0.841621
    assert row["mde"] == pytest.approx(z * math.sqrt(0.16 / n_f + 0.16 / n_m), rel=1e-5)


@pytest.mark.parametrize("args, needle", [
    (["--latency-s", "-1"], "--latency-s"),
    (["--mde", "1.5"], "--mde 1.5"),
    (["--mde", "0"], "--mde 0"),
    (["--baseline", "1.2", "--power"], "--baseline"),
])
def test_bad_power_and_timing_input_is_one_line(capsys, args, needle):
    code, _, err = run_cli(capsys, "estimate", ROLEPLAY, "--scale", "paper", *args)
    assert code == 2 and needle in err and err.count("\n") == 1, err


def test_a_prices_file_naming_an_unknown_model_is_one_line(tmp_path, capsys):
    prices = tmp_path / "prices.toml"
    prices.write_text('["openrouter:no/such-model"]\n'
                      'price_in_per_mtok = 1\nprice_out_per_mtok = 1\n')
    code, _, err = run_cli(capsys, "estimate", small_spec(tmp_path), "--scale", "paper",
                           "--prices", str(prices))
    assert code == 2 and "unknown model 'openrouter:no/such-model'" in err
    assert err.count("\n") == 1


def test_amplification_power_from_a_pilot_run(tmp_path, capsys):
    """The pilot's SD of the per-record change (exposed − clean prediction), per sex."""
    from support_runs import amplification_spec, run_spec

    from biaslab.experiments.replay import load_run_plan, open_run
    from biaslab.experiments.reports.units import unit_frame

    pilot = tmp_path / "pilot"
    run_spec(amplification_spec(options={"pipelines": ["E0"]}), pilot)
    code, out, err = run_cli(capsys, "estimate", small_spec(tmp_path), "--scale", "paper",
                             "--power", "--pilot", str(pilot), "--json")
    assert code == 0, err
    (row,) = json.loads(out)["power"]
    assert row["source"].startswith(f"pilot {pilot}")
    plan = load_run_plan(pilot, check_keys=False)
    units = unit_frame(open_run(pilot), plan.protocol, plan.options)
    units = units[units["field"] == "predicted_fail"]
    clean = units[units["condition"] == "none"].set_index(["unit", "seed"])["value"]
    exposed = units[units["condition"] != "none"]
    change = exposed["value"].to_numpy() - clean.loc[list(zip(exposed["unit"],
                                                              exposed["seed"]))].to_numpy()
    sd = {g: change[(exposed["group"] == g).to_numpy()].std(ddof=1) for g in ("F", "M")}
    z = 1.959964 + 0.841621
    assert row["mde"] == pytest.approx(
        z * math.sqrt(sd["F"] ** 2 / row["n"] + sd["M"] ** 2 / row["n_other"]), rel=1e-5)


def test_a_composed_protocol_sizes_its_declared_unit(capsys):
    spec = str(ROOT / "experiments" / "examples" / "review.toml")
    code, out, err = run_cli(capsys, "estimate", spec, "--scale", "smoke", "--mde", "0.2",
                             "--baseline", "0.3", "--json")
    assert code == 0, err
    (row,) = json.loads(out)["power"]
    assert row["unit"] == "case" and row["design"] == "paired_binary"
    # 0.3 -> 0.5 on the same cases, no within-case correlation: var = 0.21 + 0.25
    z = 1.959964 + 0.841621
    assert row["n_needed"] == math.ceil(z ** 2 * (0.21 + 0.25) / 0.2 ** 2)


def test_a_pilot_reads_a_label_measure_on_its_label_that_moves(tmp_path, capsys):
    """The README's review run as the pilot: its measure `decision` is a label, so the unit
    frame holds decision=either/older/younger. With the scripted reviewer every exposed arm
    moves `either` from 1 to 0 (72 pairs: 6 arms × 4 cases × 3 seeds): sized as its
    complement rising from 0, with the reading named."""
    review = str(ROOT / "experiments" / "examples" / "review.toml")
    pilot = tmp_path / "pilot"
    code, _, err = run_cli(capsys, "run", review, "--model", "scripted:review-synthetic",
                           "--out", str(pilot), "--quiet")
    assert code == 0, err
    code, out, err = run_cli(capsys, "estimate", review, "--scale", "paper", "--power",
                             "--pilot", str(pilot), "--json")
    assert code == 0, err
    (row,) = json.loads(out)["power"]
    assert row["source"] == f"pilot {pilot} (decision=either, 72 pairs)"
    assert row["n"] == 4 and "baseline rate 0," in row["assumptions"]
    code, out, err = run_cli(capsys, "estimate", review, "--scale", "paper", "--power",
                             "--pilot", str(pilot))
    assert code == 0 and "needs clean and exposed" not in err and "MDE" in out


def test_wall_time_follows_the_provider(capsys):
    """A scripted model costs no wall time; the embedded model's calls run one at a time at
    its measured rate; --latency-s sets every model's; each basis is printed."""
    spec = str(Path(__file__).resolve().parents[2] / "experiments" / "examples" / "review.toml")
    assert main(["estimate", spec, "--scale", "paper", "--model", "scripted:review-synthetic",
                 "--json"]) == 0
    scripted = json.loads(capsys.readouterr().out)
    assert scripted["wall_time_s"] == 0
    assert scripted["wall_time_basis"] == ["scripted: answers in-process, no model time"]
    assert main(["estimate", spec, "--scale", "paper", "--model", "local", "--json"]) == 0
    local = json.loads(capsys.readouterr().out)
    seconds, why = LATENCY_BY_PROVIDER["local"]
    assert local["wall_time_s"] == round(local["calls_estimate"] * seconds)  # one at a time
    assert local["wall_time_basis"] == [why] and "measured" in why
    assert main(["estimate", spec, "--scale", "paper", "--model", "scripted:review-synthetic",
                 "--latency-s", "2"]) == 0
    assert "2 s a call (--latency-s)" in capsys.readouterr().out
