"""One layered configuration: the cluster sections are shared by ``hfx sim`` and ``hfx serve``,
flags are generated per section, and YAML may nest settings under their section."""

from __future__ import annotations

import pytest

from hfx.cli import build_parser
from hfx.config import ClusterConfig, ServeConfig, SimConfig, model_from_args, section_of


def test_sim_and_serve_share_every_cluster_setting():
    cluster = set(ClusterConfig.model_fields)
    assert cluster <= set(SimConfig.model_fields)
    assert cluster <= set(ServeConfig.model_fields)
    assert section_of(ServeConfig, "scale_out_ratio") == "scaler"
    assert section_of(ServeConfig, "policy") == "policy"  # its default differs, not its place
    assert section_of(SimConfig, "model") is None  # sim's own


def test_serve_applies_cluster_settings_as_sim_does():
    from hfx.serving.build import build_server

    args = build_parser().parse_args([
        "serve", "--executor", "sim", "--instances", "2", "--monitor-interval", "0.25",
        "--max-instances", "3", "--scale-out-ratio", "1.5", "--scaling-cooldown", "7",
        "--policy-params", "theta=0.8", "--predictor-error", "0.2", "--max-num-seqs", "8"])
    config = model_from_args(ServeConfig, args)
    control = build_server(config).control
    assert control.monitor.interval == 0.25
    assert control.scaler.config.scale_out_ratio == 1.5
    assert control.scaler.config.cooldown == 7.0
    assert control.policy.theta == 0.8
    assert control.step_model.prefill_one(1000) == pytest.approx(
        1.2 * control.profile.model.prefill_one(1000))
    assert {inst.engine.config.max_num_seqs for inst in control.instances.values()} == {8}


def test_yaml_settings_flat_or_under_their_section(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("policy: hfx\nfleet:\n  instances: 3\n  monitor-interval: 0.5\n"
                   "scaler: {max_instances: 5, wait_threshold: 0.7}\n")
    args = build_parser().parse_args(["sim", "--instances", "4"])
    config = model_from_args(SimConfig, args, cfg)
    assert (config.policy, config.instances, config.monitor_interval) == ("hfx", 4, 0.5)
    assert (config.max_instances, config.wait_threshold) == (5, 0.7)
    cfg.write_text("scaler:\n  instances: 3\n")
    with pytest.raises(SystemExit, match="scaler: unknown setting 'instances'"):
        model_from_args(SimConfig, args, cfg)


def test_help_groups_flags_by_section(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = capsys.readouterr().out
    for section in ("fleet options", "engine options", "policy options", "scaler options",
                    "model options", "gateway options"):
        assert section in out
    scaler = out[out.index("scaler options"):out.index("model options")]
    assert "--scale-out-ratio" in scaler and "--instances" not in scaler


def test_the_engine_is_a_section_of_its_own_and_backend_urls_are_each_backends_business():
    from hfx.config import BackendSection, ServeConfig, VLLMSection, section_of
    from hfx.serving.build import build_server

    assert section_of(ServeConfig, "engine") == BackendSection.section == "backend"
    assert "engine" not in VLLMSection.model_fields
    # Every --backend is served whatever the engine: the count follows them ...
    assert ServeConfig(engine="hfx", backend=["http://a:1", "http://b:1"]).instances == 2
    # ... and a backend that runs its instances itself says it takes none.
    with pytest.raises(ValueError, match="--backend attaches to running servers"):
        build_server(ServeConfig(engine="hfx", executor="sim", backend=["http://a:1"]))
