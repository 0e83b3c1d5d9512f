"""Tenants (issue 50): who a request belongs to, their rate limits and keys, the tenants file's
errors, and a live gateway that names, limits and counts them."""

from __future__ import annotations

import math

import pytest

from hfx.cluster.tenants import TenantSpec, load_tenants
from hfx.serving.protocol import APIError
from hfx.serving.tenancy import MAX_LABELS, RateLimits, TenantLabels, tenant_of


def test_a_tenant_comes_from_its_key_then_its_headers_then_default():
    keys = {"sk-acme": "acme"}
    assert tenant_of({"authorization": "Bearer sk-acme", "x-tenant": "x"}, keys) == "acme"
    assert tenant_of({"authorization": "Bearer other", "x-tenant": "x"}, keys) == "x"
    assert tenant_of({"x-gateway-inference-fairness-id": "team-7"}, {}) == "team-7"
    assert tenant_of({}, keys) == "default"
    for bad in ("", " ", "a" * 65, "tab\there"):
        with pytest.raises(APIError, match="x-tenant must be"):
            tenant_of({"x-tenant": bad}, {})


def test_a_request_rate_refuses_the_burst_past_one_second_and_says_when_to_retry():
    limits = RateLimits({"a": TenantSpec("a", requests_per_second=2.0)})
    limits.admit("a", 10, now=0.0)
    limits.admit("a", 10, now=0.0)
    with pytest.raises(APIError) as e:
        limits.admit("a", 10, now=0.0)
    assert e.value.status == 429 and e.value.headers == {"Retry-After": "1"}
    limits.admit("a", 10, now=0.5)  # half a second refills one request
    limits.admit("b", 10, now=0.0)  # an undeclared tenant has no limit
    assert limits.refused == {"a": 1}


def test_a_token_rate_counts_prompt_and_max_tokens_and_a_request_past_it_never_fits():
    limits = RateLimits({"a": TenantSpec("a", tokens_per_minute=600.0)})
    limits.admit("a", 500, now=0.0)
    with pytest.raises(APIError) as e:
        limits.admit("a", 200, now=0.0)  # 100 left; 10 tokens a second come back
    assert e.value.headers == {"Retry-After": "10"}
    with pytest.raises(APIError, match="exceed its limit of 600") as e:
        limits.admit("a", 601, now=100.0)
    assert "Retry-After" not in e.value.headers
    limits.admit("a", 200, now=110.0)


def test_metrics_labels_are_bounded():
    label = TenantLabels({"acme"})
    assert label("acme") == "acme" and label("default") == "default"
    named = [label(f"t{i}") for i in range(MAX_LABELS + 5)]
    assert named[:MAX_LABELS] == [f"t{i}" for i in range(MAX_LABELS)]
    assert set(named[MAX_LABELS:]) == {"other"}
    assert label("t0") == "t0"  # once named, always named


@pytest.mark.parametrize(("text", "error"), [
    ("tenants: {acme: {weight: -1}}", "tenant 'acme': weight must be a positive number"),
    ("tenants: {acme: {burst: 3}}", "tenant 'acme': unknown setting 'burst'"),
    ("tenants: {acme: {api_keys: [k]}, b: {api_keys: [k]}}",
     "tenant 'b': an API key of tenant 'acme' too"),
    ("tenants: {acme: 5}", "tenant 'acme': expected a mapping"),
    ("tenants: {acme: {requests_per_second: .inf}}", "requests_per_second must be a positive"),
    ("tenants: {acme: {api_keys: k}}", "api_keys must be a list"),
    ("acme: {}", "expected a 'tenants' mapping"),
    ("tenants: [", "not valid YAML"),
])
def test_a_bad_tenants_file_names_the_entry(tmp_path, text, error):
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=error.replace("(", r"\(").replace("[", r"\[")):
        load_tenants(path)


def test_a_good_tenants_file():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.json"
        path.write_text('{"tenants": {"acme": {"weight": 2, "api_keys": ["sk-1"], '
                        '"tokens_per_minute": 1000}, "hobby": null}}')
        specs = load_tenants(path)
    assert specs["acme"] == TenantSpec("acme", 2.0, None, 1000.0, ("sk-1",))
    assert specs["hobby"] == TenantSpec("hobby")
    assert math.isclose(specs["acme"].weight, 2.0)


def test_a_live_gateway_names_limits_and_counts_its_tenants(tmp_path):
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from helpers.live import Running

    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  acme: {api_keys: [sk-acme], requests_per_second: 1}\n"
                    "  hobby: {api_keys: [sk-hobby]}\n")
    gw = Running(executor="sim", profile="tiny@cpu", instances=1, tenants=str(path))
    try:
        def ask(key: str | None, **headers: str) -> httpx.Response:
            auth = {"authorization": f"Bearer {key}"} if key else {}
            return httpx.post(f"{gw.url}/v1/completions", timeout=30,
                              headers={**auth, **headers},
                              json={"model": gw.model, "prompt": "hi", "max_tokens": 3})

        assert ask(None).status_code == 401  # keys are configured: none is no entry
        assert ask("sk-wrong").status_code == 401
        assert ask("sk-acme").status_code == 200
        limited = ask("sk-acme")  # a second within the second: over 1 per second
        assert limited.status_code == 429 and limited.headers["retry-after"] == "1"
        assert "tenant 'acme'" in limited.json()["error"]["message"]
        assert ask("sk-hobby", **{"x-tenant": "spoofed"}).status_code == 200  # the key wins
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert 'hfx_tenant_requests_total{outcome="finished",tenant="acme"} 1.0' in metrics
        assert 'hfx_tenant_requests_total{outcome="finished",tenant="hobby"} 1.0' in metrics
        assert 'hfx_tenant_rate_limited_total{tenant="acme"} 1.0' in metrics
        assert "spoofed" not in metrics
        assert gw.server.control.fair is not None  # hfx serve shares by default
    finally:
        gw.close()


def test_a_bad_tenants_file_stops_the_server_at_start(tmp_path):
    pytest.importorskip("fastapi")
    from hfx.config import ServeConfig
    from hfx.serving.build import build_server

    path = tmp_path / "tenants.yaml"
    path.write_text("tenants: {acme: {weight: 0}}")
    with pytest.raises(ValueError, match="tenant 'acme': weight"):
        build_server(ServeConfig(executor="sim", instances=1, tenants=str(path)))
