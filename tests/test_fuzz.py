"""The API under fuzzed input (issue 16's proof): a live ``hfx serve`` on loopback takes bodies
and headers drawn by hypothesis — plausible values, wrong types, NaN and Infinity, huge and
negative numbers, bad Unicode, garbage bytes, streams the client drops — and must answer every
one with a 2xx or a 4xx (never a 5xx, never a hang), stream only valid JSON, and end with
nothing queued, nothing in flight and every KV block free."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")
from helpers.live import Running  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

MAX_MODEL_LEN = 96  # bounds every request's work: the fuzz run stays quick


@pytest.fixture(scope="module")
def live():
    running = Running(executor="sim", profile="tiny@cpu", instances=2,
                      max_model_len=MAX_MODEL_LEN, priorities=2)
    yield running
    running.close()


scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)


def either(plausible: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly a value the field could take, sometimes anything at all."""
    return st.one_of(plausible, plausible, plausible, anything)


def edges(*values, around: st.SearchStrategy | None = None) -> st.SearchStrategy:
    """A field's edge values (hypothesis would rarely hit them all), or values around them."""
    picked = st.sampled_from(values)
    return either(picked if around is None else picked | around)


text = st.text(max_size=40)  # includes lone surrogates and control characters
common = {
    "max_tokens": edges(-1, 0, 1, 16, MAX_MODEL_LEN - 1, MAX_MODEL_LEN, MAX_MODEL_LEN + 1,
                        around=st.integers(-2, MAX_MODEL_LEN + 4)),
    "temperature": edges(-1.0, 0, 1e-300, 2.0, 2.0001, around=st.floats(-1, 3)),
    "top_p": edges(0, 1e-300, 0.5, 1, 1.0001, around=st.floats(0, 1)),
    "seed": edges(-1, 0, 2**63 - 1, 2**63, 2**64, around=st.integers(-1, 2**64)),
    "stream": either(st.booleans()),
    "stream_options": edges({"include_usage": True}, {"include_usage": "yes"}, {}),
    "stop": either(st.none() | text | st.lists(text, max_size=3)),
    "ignore_eos": either(st.booleans()),
    "slo": either(st.fixed_dictionaries({
        "ttft_ms": st.sampled_from([0, 1e-300, 0.5, 500, 1e9]) | st.floats(-1, 1e5),
        "tpot_ms": st.sampled_from([0, 1e-300, 0.5, 100, 1e9]) | st.floats(-1, 1e4)})),
    "priority": edges(-1, 0, 1, 2, 2**70),
    "task": edges("gsm8k", "wikisql", "nope", ""),
    "logprobs": edges(None, False, True, 0, 1),
    "top_logprobs": edges(None, 0, 1),
    "echo": either(st.booleans()),
    "n": edges(0, 1, 2),
}
messages = st.lists(st.fixed_dictionaries(
    {"role": either(st.sampled_from(["system", "user", "assistant", "robot"])),
     "content": either(text | st.lists(st.fixed_dictionaries(
         {"type": st.just("text"), "text": text}), max_size=2))}), min_size=0, max_size=3)
headers = st.dictionaries(
    st.sampled_from(["x-slo-ttft-ms", "x-slo-tpot-ms", "x-priority", "x-task"]),
    st.sampled_from(["100", "5000", "0", "-3", "inf", "nan", "1e400", "abc", "1", "gsm8k"]),
    max_size=3)


prompt_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)
valid = {
    "max_tokens": st.integers(1, 16),
    "temperature": st.floats(0, 2),
    "seed": st.integers(0, 2**63 - 1),
    "stream": st.booleans(),
    "stop": st.lists(st.text(st.characters(codec="utf-8"), max_size=3), max_size=2),
    "ignore_eos": st.booleans(),
    "task": st.sampled_from(["gsm8k", "wikisql"]),
}


@st.composite
def calls(draw) -> tuple[str, bytes, dict[str, str], bool]:
    """(path, body bytes, headers, whether to drop a stream after its first chunk): a valid
    request, one with a field or two changed to anything, or a wild one."""
    chat = draw(st.booleans())
    kind = draw(st.sampled_from(["valid", "mutated", "wild"]))
    if kind == "wild":
        fields = dict(common, **({"messages": either(messages)} if chat else
                                 {"prompt": either(text | st.lists(st.integers(-5, 600),
                                                                   max_size=8))}))
        body = draw(st.fixed_dictionaries({"model": either(st.sampled_from(["MODEL", "other"]))},
                                          optional=fields))
    else:
        start = ({"messages": st.just([{"role": "user", "content": draw(prompt_text)}])}
                 if chat else {"prompt": prompt_text})
        body = draw(st.fixed_dictionaries({"model": st.just("MODEL"), **start},
                                          optional=valid))
        if kind == "mutated":
            for key in draw(st.lists(st.sampled_from(sorted(common)), min_size=1, max_size=2)):
                body[key] = draw(common[key])  # near the boundary, or anything
    if draw(st.integers(0, 19)) == 0:
        raw = draw(st.binary(max_size=40))  # not JSON at all
    else:
        raw = json.dumps(body).encode("utf-8", "surrogatepass")  # NaN, Infinity, surrogates
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return path, raw, draw(headers) if kind != "valid" else {}, draw(st.booleans())


def call(live, path: str, raw: bytes, hdrs: dict[str, str], drop: bool) -> int:
    raw = raw.replace(b'"MODEL"', json.dumps(live.model).encode())
    hdrs = {**hdrs, "content-type": "application/json"}
    with httpx.Client(base_url=live.url, timeout=30) as client, \
            client.stream("POST", path, content=raw, headers=hdrs) as r:
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            for line in r.iter_lines():
                if not line:
                    continue
                assert line.startswith("data: "), line
                if line != "data: [DONE]":
                    json.loads(line[6:], parse_constant=_no_constant)  # strict JSON
                if drop:
                    break  # the client goes away mid-stream
        else:
            r.read()
            json.loads(r.text, parse_constant=_no_constant)
        return r.status_code


def _no_constant(name: str) -> None:
    raise AssertionError(f"{name} in a response: not JSON")


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(calls())
def test_fuzzed_requests_get_2xx_or_4xx_and_valid_json(live, one):
    status = call(live, *one)
    assert 200 <= status < 500, status


def test_after_the_fuzz_nothing_is_left_behind(live):
    """Runs after the fuzz (file order): every gauge back to zero."""
    control = live.server.control
    deadline = time.monotonic() + 30
    while True:
        text = httpx.get(f"{live.url}/metrics").text
        gauges = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
                  if line.startswith(("hfx_queued_requests ", "hfx_in_flight_requests ",
                                      "hfx_instance_running", "hfx_instance_waiting",
                                      "hfx_instance_kv_usage"))}
        if not any(gauges.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(gauges) == 2 + 3 * 2 and not any(gauges.values()), gauges
    assert not control.records  # every ended request was forgotten
    assert control.num_instance_failures == 0
    served = sum(live.server.metrics.count(task, "finished")
                 for task in ("default", "gsm8k", "wikisql"))
    assert served > 10  # the fuzz reached the engines, not only the validators
