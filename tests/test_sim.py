"""Whole simulated runs: determinism, the result contract, sanity of the curves."""

from __future__ import annotations

import json

import pytest

from hfx.cli import main
from hfx.config import SimConfig
from hfx.sim.driver import simulate

CONTRACT = ("policy", "workload", "mode", "qps", "seed", "requests", "finished", "attainment",
            "attainment_dslo", "ttft", "tpot", "e2e", "cost_units", "goodput_rps", "per_task",
            "sim_seconds", "wall_seconds")


def small(**kw) -> SimConfig:
    return SimConfig(requests_per_task=40, **kw)


def test_result_has_the_contract_keys():
    r = simulate(small(qps=8))
    for key in CONTRACT:
        assert key in r, key
    for key in ("ttft", "tpot", "e2e"):
        assert set(r[key]) >= {"mean", "p50", "p90", "p99"}
    assert set(r["per_task"]) == {"medical_qa", "tldr_content_gen", "tldr_headline_gen",
                                  "wikisql"}
    assert r["requests"] == r["finished"] == 160


@pytest.mark.parametrize("policy", ["rr", "least-loaded"])
def test_same_seed_gives_identical_json(policy):
    def once():
        r = simulate(small(policy=policy, qps=60, seed=5))
        r.pop("wall_seconds")
        return json.dumps(r, sort_keys=True)

    assert once() == once()


def test_other_seed_other_result():
    a = simulate(small(qps=60, seed=1))
    b = simulate(small(qps=60, seed=2))
    assert a["e2e"] != b["e2e"]


def test_attainment_falls_as_load_rises():
    light = simulate(SimConfig(qps=20, requests_per_task=100))
    heavy = simulate(SimConfig(qps=200, requests_per_task=100))
    assert light["attainment"] > 0.95
    assert heavy["attainment"] < light["attainment"]
    assert heavy["ttft"]["p90"] > light["ttft"]["p90"]


def test_fewer_instances_means_worse_service_under_load():
    one = simulate(small(qps=60, instances=1))
    four = simulate(small(qps=60, instances=4))
    assert one["e2e"]["mean"] > four["e2e"]["mean"]
    assert one["attainment"] <= four["attainment"]


def test_small_kv_cache_preempts_but_loses_nothing():
    r = simulate(small(qps=60, kv_capacity_tokens=4096, planner="chunked"))
    assert r["finished"] == r["requests"]


def test_request_too_long_for_kv_fails_cleanly_and_the_rest_go_on(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join([
        '{"arrival": 0.0, "input_len": 100, "output_len": 5, "task": "medical_qa"}',
        '{"arrival": 0.1, "input_len": 9000, "output_len": 5, "task": "medical_qa"}',
        '{"arrival": 0.2, "input_len": 100, "output_len": 5, "task": "medical_qa"}',
    ]) + "\n")
    r = simulate(SimConfig(workload=str(trace), kv_capacity_tokens=4096))
    assert (r["requests"], r["finished"], r["failed"]) == (3, 2, 1)


def test_cli_sim_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["sim", "--policy", "least-loaded", "--qps", "10", "--requests-per-task", "20",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["policy"] == "least-loaded" and data["requests"] == 80
    assert "attainment" in capsys.readouterr().out


def test_cli_yaml_config_and_flag_override(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("policy: least-loaded\nqps: 5\nrequests-per-task: 10\n")
    out = tmp_path / "r.json"
    assert main(["sim", "--config", str(cfg), "--qps", "7", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert (data["policy"], data["qps"], data["requests"]) == ("least-loaded", 7.0, 40)


def test_cli_unknown_names_list_the_valid_ones(capsys):
    with pytest.raises(SystemExit) as e:
        main(["sim", "--policy", "nope"])
    assert "rr, least-loaded" in str(e.value)
    with pytest.raises(SystemExit) as e:
        main(["sim", "--workload", "nope"])
    assert "four-task" in str(e.value)


def test_cli_sweep_series_do_not_inherit_each_others_fields(tmp_path, monkeypatch):
    from hfx.evaluation import presets

    monkeypatch.setitem(presets.PRESETS, "two", presets.Preset(
        "test", "four-task", (("scaling", {"policy": "rr", "max_instances": 4}),
                              ("fixed", {"policy": "rr"})), (10.0,),
        config={"requests_per_task": 5}))
    assert main(["sweep", "--preset", "two", "--out", str(tmp_path), "--jobs", "1"]) == 0
    rows = {r["series"]: r for r in json.loads((tmp_path / "two.json").read_text())}
    assert rows["scaling"]["config"]["max_instances"] == 4
    assert rows["fixed"]["config"]["max_instances"] is None


def test_cli_sweep_preset_may_set_any_field(tmp_path, capsys, monkeypatch):
    from hfx.evaluation import presets

    monkeypatch.setitem(presets.PRESETS, "tiny", presets.Preset(
        "test", "four-task", (("a", {"policy": "rr"}),), (10.0,),
        config={"model": "qwen2.5-32b", "requests_per_task": 5}))
    assert main(["sweep", "--preset", "tiny", "--out", str(tmp_path), "--jobs", "1"]) == 0
    (row,) = json.loads((tmp_path / "tiny.json").read_text())
    assert row["profile"] == "qwen2.5-32b@ascend-910b" and row["requests"] == 20


def test_cli_sweep_writes_table_json_and_plot(tmp_path, capsys):
    assert main(["sweep", "--policies", "rr,least-loaded", "--qps", "10,40",
                 "--requests-per-task", "15", "--out", str(tmp_path), "--jobs", "1"]) == 0
    rows = json.loads((tmp_path / "sweep-four-task.json").read_text())
    assert [(r["policy"], r["qps"]) for r in rows] == [
        ("rr", 10.0), ("rr", 40.0), ("least-loaded", 10.0), ("least-loaded", 40.0)]
    assert (tmp_path / "sweep-four-task.png").stat().st_size > 10_000
    assert "attain" in capsys.readouterr().out
