"""Trace formats: HFX's own, served-request records, Azure, BurstGPT and Mooncake traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hfx.request import SLO
from hfx.workloads.load import load_trace
from hfx.workloads.tasks import DEFAULT_SLO, TASKS
from hfx.workloads.traces import (
    FORMATS,
    SLOMap,
    TraceError,
    TraceRow,
    detect_format,
    load_rows,
    parse_slo_map,
    read_trace,
)

AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2023-11-16 18:15:46.6805900,374,44\n"
         "2023-11-16 18:15:50.9951690,396,109\n"
         "2023-11-16 18:15:51.2224670,879,55\n")
BURSTGPT = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,472,18,490,Conversation log\n"
            "45,ChatGPT,1087,0,1087,Conversation log\n"
            "118,GPT-4,417,276,693,API log\n"
            "130,ChatGPT,100,0,100,API log\n"
            "131.5,GPT-4,20,7,27,API log\n")
# Mooncake's own README rows (FAST25-release): 12 shared 512-token blocks, then each its own.
SHARED_IDS = list(range(46, 58))
MOONCAKE = [{"timestamp": 0, "input_length": 6955, "output_length": 52,
             "hash_ids": [*SHARED_IDS, 2353, 2354]},
            {"timestamp": 27482, "input_length": 6472, "output_length": 26,
             "hash_ids": [*SHARED_IDS, 2366]},
            {"timestamp": 30000, "input_length": 100, "output_length": 9, "hash_ids": [2367]}]
DEFAULT = parse_slo_map("default=2000:500")


def write(path, text):
    path.write_text(text)
    return path


def jsonl(path, rows):
    return write(path, "".join(json.dumps(r) + "\n" for r in rows))


def record(**kw):
    row = {"id": "r0", "arrival": 1700000000.25, "input_len": 10, "output_len": 5,
           "max_tokens": 64, "slo": {"ttft_ms": 1500, "tpot_ms": 250}, "slo_source": "body",
           "task": "chat", "priority": None, "outcome": "finished", "instance": 0,
           "ttft_s": 0.1, "tpot_s": 0.02, "e2e_s": 0.2, "queue_s": 0.0}
    return row | kw


# ---- detection -------------------------------------------------------------------------------
def test_detects_each_format(tmp_path):
    files = {
        "hfx": [write(tmp_path / "t.csv", "arrival,input_len,output_len\n0,1,1\n"),
                jsonl(tmp_path / "t.jsonl", [{"arrival": 0, "input_len": 1, "output_len": 1}])],
        "hfx-record": [jsonl(tmp_path / "rec.jsonl", [record()])],
        "azure": [write(tmp_path / "AzureLLMInferenceTrace_code.csv", AZURE)],
        "burstgpt": [write(tmp_path / "BurstGPT_1.csv", BURSTGPT)],
        "mooncake": [jsonl(tmp_path / "conversation_trace.jsonl", MOONCAKE)],
    }
    assert set(files) == set(FORMATS)
    for fmt, paths in files.items():
        for path in paths:
            assert detect_format(path) == fmt, path
            assert load_rows(path).format == fmt


@pytest.mark.parametrize("name, text", [
    ("other.csv", "time,prompt,completion\n0,1,1\n"),
    ("other.jsonl", '{"time": 0, "prompt": 1}\n'),
    ("trace.txt", "arrival,input_len,output_len\n0,1,1\n"),
])
def test_unknown_format_lists_the_formats(tmp_path, name, text):
    with pytest.raises(TraceError, match="hfx, hfx-record, azure, burstgpt, mooncake"):
        detect_format(write(tmp_path / name, text))


def test_unknown_format_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown trace format 'sharegpt'"):
        read_trace(write(tmp_path / "t.csv", AZURE), fmt="sharegpt")


# ---- hfx --------------------------------------------------------------------------------------
def test_hfx_agrees_with_load_trace(tmp_path):
    path = jsonl(tmp_path / "t.jsonl", [
        {"arrival": 0.5, "input_len": 10, "output_len": 3, "ttft": 1, "tpot": 0.1, "id": "a"},
        {"arrival": 0.25, "input_len": 5, "output_len": 2, "task": "gsm8k"},
        {"arrival": 0.75, "input_len": 7, "output_len": 4, "task": "chat", "priority": 1}])
    ours, theirs = read_trace(path), load_trace(path)
    assert ours == theirs  # HFX's own traces replay exactly as they always did: not shifted
    assert [(r.id, r.arrival, r.slo, r.priority) for r in ours] == [
        ("trace-1", 0.25, TASKS["gsm8k"].slo, None), ("a", 0.5, SLO(1.0, 0.1), None),
        ("trace-2", 0.75, None, 1)]


def test_hfx_csv_row_without_slo_takes_the_map(tmp_path):
    path = write(tmp_path / "t.csv", "arrival,input_len,output_len,task\n2,12,4,chat\n")
    (r,) = read_trace(path, slo_map=DEFAULT)
    assert (r.arrival, r.prompt_len, r.max_tokens, r.task, r.slo) == (2.0, 12, 4, "chat",
                                                                       SLO(2.0, 0.5))


# ---- azure ------------------------------------------------------------------------------------
def test_azure_arrivals_are_exact_seconds_since_the_first_row(tmp_path):
    path = write(tmp_path / "AzureLLMInferenceTrace_conv.csv", AZURE)
    reqs = read_trace(path, slo_map=DEFAULT)
    assert [r.arrival for r in reqs] == [0.0, 4.314579, 4.541877]
    assert [(r.prompt_len, r.max_tokens) for r in reqs] == [(374, 44), (396, 109), (879, 55)]
    assert {r.task for r in reqs} == {"azure-conv"}
    assert [r.id for r in reqs] == ["trace-0", "trace-1", "trace-2"]


def test_azure_seventh_digit_is_truncated_not_rounded(tmp_path):
    path = write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                     "2023-11-16 18:15:46.0000009,1,1\n"
                                     "2023-11-16 18:15:47.0000000,1,1\n")
    assert [r.arrival for r in load_rows(path).rows] == [0.0, 1.0]  # rounded: 0.999999


def test_azure_2024_timestamps_with_zone_and_zero_outputs(tmp_path):
    path = write(tmp_path / "AzureLLMInferenceTrace_code_1week.csv",
                 "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2024-05-10 00:00:00.009930+00:00,2048,28\n"
                 "2024-05-10 00:00:01.5+00:00,100,0\n"
                 "2024-05-10 00:00:02.509930+00:00,7,3\n"
                 "2024-05-10 01:00:04.009930+01:00,9,2\n"  # 4 s after the first row
                 "2024-05-10 00:00:05.009930Z,9,1\n")
    report = load_rows(path)
    assert report.skipped == 1
    assert report.rows == [TraceRow(0.0, 2048, 28, "azure-code"), TraceRow(2.5, 7, 3, "azure-code"),
                           TraceRow(4.0, 9, 2, "azure-code"), TraceRow(5.0, 9, 1, "azure-code")]


def test_azure_task_from_file_name(tmp_path):
    for name, task in [("AzureLLMInferenceTrace_code.csv", "azure-code"),
                       ("AzureLLMInferenceTrace_conv.csv", "azure-conv"), ("llm.csv", "azure")]:
        assert {r.task for r in load_rows(write(tmp_path / name, AZURE)).rows} == {task}


# ---- burstgpt ---------------------------------------------------------------------------------
def test_burstgpt_skips_failed_requests_and_counts_them(tmp_path):
    path = write(tmp_path / "BurstGPT_1.csv", BURSTGPT)
    report = load_rows(path)
    assert report.skipped == 2
    assert report.rows == [TraceRow(5.0, 472, 18, "ChatGPT"), TraceRow(118.0, 417, 276, "GPT-4"),
                           TraceRow(131.5, 20, 7, "GPT-4")]
    reqs = read_trace(path, slo_map=parse_slo_map("GPT-4=1000:100,default=2000:500"))
    assert [(r.arrival, r.task, r.slo) for r in reqs] == [
        (0.0, "ChatGPT", SLO(2.0, 0.5)), (113.0, "GPT-4", SLO(1.0, 0.1)),
        (126.5, "GPT-4", SLO(1.0, 0.1))]


def test_a_trace_of_only_skipped_rows_says_so(tmp_path):
    path = write(tmp_path / "BurstGPT_2.csv", BURSTGPT.splitlines()[0] + "\n"
                 "1,ChatGPT,10,0,10,API log\n")
    with pytest.raises(TraceError, match=r"no requests \(1 rows with 0 output tokens skipped"):
        read_trace(path, slo_map=DEFAULT)


# ---- mooncake ---------------------------------------------------------------------------------
def test_mooncake_milliseconds_become_seconds(tmp_path):
    path = jsonl(tmp_path / "toolagent_trace.jsonl", MOONCAKE)
    reqs = read_trace(path, slo_map=DEFAULT)
    assert [(r.arrival, r.prompt_len, r.max_tokens, r.task) for r in reqs] == [
        (0.0, 6955, 52, "mooncake"), (27.482, 6472, 26, "mooncake"), (30.0, 100, 9, "mooncake")]


def test_mooncake_keeps_hash_ids_as_512_token_block_hashes(tmp_path):
    path = jsonl(tmp_path / "conversation_trace.jsonl", MOONCAKE)
    reqs = read_trace(path, slo_map=DEFAULT)
    assert [r.block_hashes for r in reqs] == [(*SHARED_IDS, 2353, 2354), (*SHARED_IDS, 2366),
                                              (2367,)]
    assert {r.hash_block for r in reqs} == {512}
    # The rows' own view too, and rescaled arrivals keep them.
    assert [r.block_hashes for r in load_rows(path).rows] == [r.block_hashes for r in reqs]
    for kw in ({"time_scale": 4.0}, {"target_qps": 0.5}):
        again = read_trace(path, slo_map=DEFAULT, **kw)
        assert [(r.block_hashes, r.hash_block) for r in again] == [
            (r.block_hashes, r.hash_block) for r in reqs]
        assert [r.arrival for r in again] != [r.arrival for r in reqs]


def test_mooncake_row_without_hash_ids_names_no_content(tmp_path):
    path = jsonl(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 600, "output_length": 2},
                                        {"timestamp": 1, "input_length": 600, "output_length": 2,
                                         "hash_ids": None}])
    assert [r.block_hashes for r in read_trace(path, slo_map=DEFAULT)] == [None, None]


def test_azure_and_burstgpt_name_no_content(tmp_path):
    for name, text in (("AzureLLMInferenceTrace_code.csv", AZURE), ("BurstGPT_1.csv", BURSTGPT)):
        reqs = read_trace(write(tmp_path / name, text), slo_map=DEFAULT)
        assert {r.block_hashes for r in reqs} == {None}


@pytest.mark.parametrize("hash_ids, message", [
    ([*SHARED_IDS, 2353], r"13 hash_ids for 6955 input tokens; expected ceil\(6955 / 512\) = 14"),
    ([*SHARED_IDS, 2353, 2354, 2355], "15 hash_ids for 6955 input tokens"),
    ([*SHARED_IDS, 2353, -1], "hash_ids must be a list of non-negative integers"),
    ([*SHARED_IDS, 2353, 1.5], "hash_ids must be a list of non-negative integers"),
    ([*SHARED_IDS, 2353, True], "hash_ids must be a list of non-negative integers"),
    ([*SHARED_IDS, 2353, "7"], "hash_ids must be a list of non-negative integers"),
    ("46,47", "hash_ids must be a list of non-negative integers"),
])
def test_mooncake_row_with_bad_hash_ids_names_file_and_line(tmp_path, hash_ids, message):
    path = jsonl(tmp_path / "conversation_trace.jsonl",
                 [MOONCAKE[1], MOONCAKE[0] | {"hash_ids": hash_ids}, MOONCAKE[2]])
    with pytest.raises(TraceError, match=message) as e:
        read_trace(path, slo_map=DEFAULT)
    assert str(e.value).startswith(f"{path}:2: ")


# ---- SLO maps ---------------------------------------------------------------------------------
def test_slo_map_precedence_task_then_length_class_then_default():
    m = parse_slo_map("default=2000:500, GPT-4=1000:100, input<=512=800:80, input>4096=9000:900")
    assert m == SLOMap({"GPT-4": SLO(1.0, 0.1)},
                       (("<=", 512, SLO(0.8, 0.08)), (">", 4096, SLO(9.0, 0.9))), SLO(2.0, 0.5))
    assert m.slo_for("GPT-4", 10) == SLO(1.0, 0.1)  # the task beats a matching length class
    assert m.slo_for("ChatGPT", 512) == SLO(0.8, 0.08)
    assert m.slo_for(None, 5000) == SLO(9.0, 0.9)
    assert m.slo_for("ChatGPT", 513) == SLO(2.0, 0.5)
    assert parse_slo_map("GPT-4=1000:100").slo_for("ChatGPT", 1) is None


def test_slo_map_length_classes_are_checked_in_order():
    m = parse_slo_map("input>100=1000:100,input<=512=800:80")
    assert m.slo_for("x", 300) == SLO(1.0, 0.1)
    assert parse_slo_map("input<=512=800:80,input>100=1000:100").slo_for("x", 300) == SLO(0.8,
                                                                                          0.08)


@pytest.mark.parametrize("text, message", [
    ("", "expected KEY=TTFT_MS:TPOT_MS"),
    ("default=2000:500,", "expected KEY=TTFT_MS:TPOT_MS"),
    ("2000:500", "expected KEY=TTFT_MS:TPOT_MS"),
    ("default=2000", "two positive numbers"),
    ("default=fast:500", "two positive numbers"),
    ("default=0:500", "two positive numbers"),
    ("default=2000:-1", "two positive numbers"),
    ("default=2000:500,default=1000:100", "'default' is given twice"),
    ("input<512=800:80", "input<=N or input>N"),
    ("input>=512=800:80", "input<=N or input>N"),
])
def test_malformed_slo_map(text, message):
    with pytest.raises(ValueError, match=message):
        parse_slo_map(text)


def test_slo_precedence_own_then_map_then_table1_then_priority(tmp_path):
    path = jsonl(tmp_path / "t.jsonl", [
        {"arrival": 0, "input_len": 1, "output_len": 1, "task": "gsm8k", "ttft": 3, "tpot": 0.25},
        {"arrival": 1, "input_len": 1, "output_len": 1, "task": "gsm8k"},
        {"arrival": 2, "input_len": 1, "output_len": 1, "task": "chat", "priority": 2}])
    m = parse_slo_map("gsm8k=1000:100")
    assert [(r.slo, r.priority) for r in read_trace(path, slo_map=m)] == [
        (SLO(3.0, 0.25), None), (SLO(1.0, 0.1), None), (None, 2)]
    assert [r.slo for r in read_trace(path)] == [SLO(3.0, 0.25), TASKS["gsm8k"].slo, None]
    assert read_trace(path, slo_map=DEFAULT)[2].slo == SLO(2.0, 0.5)


def test_a_trace_without_slos_gets_the_serving_default_and_says_so(tmp_path, caplog):
    path = write(tmp_path / "AzureLLMInferenceTrace_conv.csv", AZURE)
    with caplog.at_level("WARNING", logger="hfx.workloads.traces"):
        requests = read_trace(path)
    assert {r.slo for r in requests} == {SLO(2.0, 0.5)} == {DEFAULT_SLO}
    assert f"{len(requests)} of {len(requests)} requests carry no SLO" in caplog.text
    assert "TTFT 2000 ms, TPOT 500 ms" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hfx.workloads.traces"):  # the map still decides
        mapped = read_trace(path, slo_map=parse_slo_map("default=800:80"))
    assert {r.slo for r in mapped} == {SLO(0.8, 0.08)} and not caplog.text


# ---- time scaling -----------------------------------------------------------------------------
def clock_trace(tmp_path, arrivals):
    """A trace on a clock of its own (Mooncake's, in ms): shifted to start at 0."""
    return jsonl(tmp_path / "t.jsonl", [{"timestamp": a * 1000, "input_length": 1,
                                         "output_length": 1} for a in arrivals])


def read(path, **kw):
    return read_trace(path, slo_map=DEFAULT, **kw)


def test_arrivals_shifted_to_zero_and_sorted(tmp_path):
    reqs = read(clock_trace(tmp_path, [12.0, 10.0, 11.5]))
    assert [(r.id, r.arrival) for r in reqs] == [("trace-1", 0.0), ("trace-2", 1.5),
                                                 ("trace-0", 2.0)]


def test_time_scale_divides_arrivals(tmp_path):
    path = clock_trace(tmp_path, [10.0, 11.0, 13.0])
    assert [r.arrival for r in read(path, time_scale=2)] == [0.0, 0.5, 1.5]
    assert [r.arrival for r in read(path, time_scale=0.5)] == [0.0, 2.0, 6.0]


def test_target_qps_rescales_to_the_rate(tmp_path):
    reqs = read(clock_trace(tmp_path, [0.0, 1.0, 2.0, 4.0]), target_qps=2)
    assert [r.arrival for r in reqs] == [0.0, 0.5, 1.0, 2.0]  # 4 requests / 2 s
    reqs = read(clock_trace(tmp_path, [3.0, 4.0, 5.0]), target_qps=0.75)
    assert [r.arrival for r in reqs] == [0.0, 2.0, 4.0]  # 3 requests / 4 s
    assert [r.arrival for r in read(clock_trace(tmp_path, [7.0]), target_qps=5)] == [0.0]


def test_time_scale_and_target_qps_are_checked(tmp_path):
    path = clock_trace(tmp_path, [0.0, 1.0])
    with pytest.raises(ValueError, match="not both"):
        read(path, time_scale=2, target_qps=1)
    with pytest.raises(ValueError, match="time_scale must be positive"):
        read(path, time_scale=0)
    with pytest.raises(ValueError, match="target_qps must be positive"):
        read(path, target_qps=-1)
    with pytest.raises(TraceError, match="arrives at once"):
        read(clock_trace(tmp_path, [1.0, 1.0]), target_qps=1)


# ---- hfx-record -------------------------------------------------------------------------------
def test_record_replays_what_was_asked(tmp_path):
    path = jsonl(tmp_path / "rec.jsonl", [
        record(),
        record(id="r1", arrival=1700000001.75, outcome="aborted", output_len=3, max_tokens=64),
        record(id="r2", arrival=1700000000.75, outcome="shed", output_len=0, max_tokens=0,
               slo=None, slo_source="default", task="gsm8k"),
        record(id="r3", arrival=1700000002.25, outcome="rejected", max_tokens=32, task="gsm8k",
               slo={"ttft_ms": 700, "tpot_ms": 200}, slo_source="priority", priority=1),
        record(id="r4", arrival=1700000002.5, slo_source="priority", priority=None)])
    reqs = read_trace(path, slo_map=DEFAULT)
    assert [(r.id, r.arrival, r.prompt_len, r.max_tokens, r.slo, r.task, r.priority)
            for r in reqs] == [
        ("r0", 0.0, 10, 5, SLO(1.5, 0.25), "chat", None),
        ("r2", 0.5, 10, 1, SLO(2.0, 0.5), "gsm8k", None),  # shed: max(max_tokens, 1)
        ("r1", 1.5, 10, 64, SLO(1.5, 0.25), "chat", None),  # aborted: its max_tokens
        ("r3", 2.0, 10, 32, None, "gsm8k", 1),  # mapped from its priority again: no map, no T1
        ("r4", 2.25, 10, 5, SLO(1.5, 0.25), "chat", None)]  # no priority: the SLO stays


def test_record_rows_may_carry_block_hashes(tmp_path):
    path = jsonl(tmp_path / "rec.jsonl", [
        record(input_len=40, output_len=5, block_hashes=[7, 8, 9]),  # 16 tokens a hash
        record(id="r1", arrival=1700000001.25, input_len=40, output_len=5, block_hashes=[7],
               hash_block=64),
        record(id="r2", arrival=1700000002.25)])
    reqs = read_trace(path)
    assert [(r.id, r.block_hashes, r.hash_block) for r in reqs] == [
        ("r0", (7, 8, 9), 16), ("r1", (7,), 64), ("r2", None, 16)]


@pytest.mark.parametrize("extra, message", [
    ({"block_hashes": [7, 8]}, r"2 block hashes of 16 tokens do not cover its 40 prompt tokens "
                               r"\(need 3\)"),
    ({"block_hashes": [7, 8, 9, 10]}, r"request r1: 4 block hashes of 16 tokens do not cover its "
                                      r"40 prompt tokens \(need 3\)"),
    ({"block_hashes": [7, 8, 9], "hash_block": 0}, "hash_block must be >= 1"),
    ({"block_hashes": [7, "8", 9]}, "block_hashes must be a list of non-negative integers"),
])
def test_record_row_with_bad_block_hashes_names_file_and_line(tmp_path, extra, message):
    path = jsonl(tmp_path / "rec.jsonl", [record(input_len=40, output_len=5),
                                          record(id="r1", input_len=40, output_len=5, **extra)])
    with pytest.raises(TraceError, match=message) as e:
        read_trace(path)
    assert str(e.value).startswith(f"{path}:2: ")


def test_record_arrivals_relative_to_the_first_row(tmp_path):
    path = jsonl(tmp_path / "rec.jsonl", [record(arrival=1700000003.5),
                                          record(id="r1", arrival=1700000001.25)])
    assert [r.arrival for r in load_rows(path).rows] == [0.0, -2.25]
    assert [r.arrival for r in read_trace(path)] == [0.0, 2.25]


# ---- errors name file and line ----------------------------------------------------------------
@pytest.mark.parametrize("name, text, line, message", [
    ("t.jsonl", '{"arrival": 0, "input_len": 1, "output_len": 1}\n'
                '{"arrival": 0, "input_len": 0, "output_len": 1}\n', 2, ">= 1"),
    ("t.csv", "arrival,input_len,output_len\n0,1,1\n0,x,1\n", 3, "'input_len' is not a number"),
    ("t.csv", "arrival,input_len,output_len\n0,1,1\n0,1,1,9\n", 3, "more values"),
    ("t.jsonl", '{"arrival": 0, "input_len": 1, "output_len": 1, "colour": 1}\n', 1,
     "unknown field"),
    ("AzureLLMInferenceTrace_code.csv",
     AZURE + "2023-11-16 18:16:00,1,1\n16/11/2023 18:16:01,1,1\n", 6,
     "TIMESTAMP is not a date and time"),
    ("a.csv", AZURE + "2023-11-16 18:16:00.1,0,4\n", 5, ">= 1"),
    ("BurstGPT_1.csv", BURSTGPT + "140,GPT-4,12.5,3,15.5,API log\n", 7, "whole number"),
    ("BurstGPT_1.csv", BURSTGPT + "-1,GPT-4,1,3,4,API log\n", 7, "finite and >= 0"),
    ("conversation_trace.jsonl", json.dumps(MOONCAKE[0]) + "\n\n"
     '{"timestamp": 5, "input_length": 0, "output_length": 3}\n', 3, ">= 1"),
    ("conversation_trace.jsonl", json.dumps(MOONCAKE[0]) + '\n{"timestamp": 5,\n', 2,
     "not valid JSON"),
    ("rec.jsonl", json.dumps(record()) + "\n" + json.dumps(record(outcome="lost")) + "\n", 2,
     "outcome must be one of"),
    ("rec.jsonl", json.dumps(record()) + "\n" + json.dumps(record(slo={"ttft_ms": 1})) + "\n", 2,
     "missing required field 'tpot_ms'"),
])
def test_a_malformed_row_names_file_and_line(tmp_path, name, text, line, message):
    path = write(tmp_path / name, text)
    with pytest.raises(TraceError, match=message) as e:
        read_trace(path, slo_map=DEFAULT)
    assert f"{path}:{line}:" in str(e.value)


def test_ids_must_be_unique(tmp_path):
    path = jsonl(tmp_path / "rec.jsonl", [record(), record(arrival=1700000001.0)])
    with pytest.raises(TraceError, match="ids are not unique"):
        read_trace(path)


def test_hfx_whatif_on_a_public_trace_writes_its_answer(tmp_path, capsys):
    from hfx.cli import main

    rows = "".join(f"2023-11-16 18:15:{i * 0.5:09.6f}0,{100 + i},{8 + i % 3}\n"
                   for i in range(20))
    path = write(tmp_path / "AzureLLMInferenceTrace_code.csv",
                 "TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    out = tmp_path / "w.json"
    assert main(["whatif", "--trace", str(path), "--slo-map", "azure-code=3000:200",
                 "--policies", "rr", "--instances", "1,2", "--jobs", "1", "--json",
                 str(out)]) == 0
    result = json.loads(out.read_text())
    assert [(r["policy"], r["instances"], r["finished"]) for r in result["rows"]] == [
        ("rr", 1, 20), ("rr", 2, 20)]
    assert result["smallest"] == {"rr": 1}
    assert "smallest fleet at attainment >= 0.9: rr 1" in capsys.readouterr().out


def test_hfx_whatif_finds_the_rate_of_a_trace_each_fleet_carries(tmp_path, capsys):
    """``--capacity``: per policy and fleet, the highest rate of this trace (rescaled) at the
    target; twice the fleet carries more of it; the hit rate is in the table."""
    from hfx.cli import main

    trace = str(Path(__file__).parent / "golden" / "traces" / "sessions.jsonl")
    out = tmp_path / "w.json"
    assert main(["whatif", "--trace", trace, "--slo-map", "default=2000:500",
                 "--policies", "least-loaded", "--instances", "1,2", "--capacity",
                 "--jobs", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    one, two = (r["capacity_qps"] for r in rows)
    assert 0 < one < two and all(r["hit_rate"] > 0.3 for r in rows)
    assert "capacity" in capsys.readouterr().out.splitlines()[0]


def test_a_tenant_column_names_each_requests_tenant_and_the_simulator_shares_by_it(tmp_path):
    from hfx.config import SimConfig
    from hfx.sim.driver import simulate

    path = jsonl(tmp_path / "tenants.jsonl", [
        {"arrival": i * 0.01, "input_len": 50, "output_len": 20, "task": "gsm8k",
         "tenant": "flood" if i % 4 else "calm"} for i in range(40)]
        + [{"arrival": 0.5, "input_len": 50, "output_len": 20, "task": "gsm8k"}])
    requests = read_trace(path)
    assert [r.tenant for r in requests[:5]] == ["calm", "flood", "flood", "flood", "calm"]
    assert requests[-1].tenant == "default"  # no column: the default tenant
    result = simulate(SimConfig(workload=str(path), instances=1, policy="hfx",
                                fair_share="class"))
    assert result["finished"] == 41


def test_a_recorded_rows_tenant_is_replayed(tmp_path):
    path = jsonl(tmp_path / "rec.jsonl", [record(tenant="acme"), record(id="r1")])
    assert [r.tenant for r in read_trace(path)] == ["acme", "default"]
