"""Trace files: each source format's reader on a literal sample, detection, and errors that name file and line."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from opentela.bench.traces import (
    CSV_COLUMNS,
    TraceRecord,
    parse_model_map,
    read_trace,
    select_models,
    write_trace,
)
from opentela.bench.workload import PlannedRequest, trace_plan
from opentela.errors import ConfigError

OURS_CSV = """\
timestamp,model,input_tokens,output_tokens,temperature,top_p,max_tokens,e2e_s,ttft_s,reasoning,prefix_hashes,session
1700000002.5,Qwen3-32B,120,30,0.7,0.95,512,3.25,0.4,true,a1 b2 c3,conv-1
1700000001.0,"Llama, 70B",80,0,,,,,,,,
"""
OURS_JSONL = """\
{"timestamp": 1700000002.5, "model": "Qwen3-32B", "input_tokens": 120, "output_tokens": 30, "temperature": 0.7, \
"top_p": 0.95, "max_tokens": 512, "e2e_s": 3.25, "ttft_s": 0.4, "reasoning": true, \
"prefix_hashes": ["a1", "b2", "c3"], "session": "conv-1"}

{"timestamp": 1700000001.0, "model": "Llama, 70B", "input_tokens": 80, "output_tokens": 0, "reasoning": null}
"""
OURS = [
    TraceRecord(1700000001.0, "Llama, 70B", 80, 0),
    TraceRecord(
        1700000002.5, "Qwen3-32B", 120, 30, 0.7, 0.95, 512, 3.25, 0.4, True, ("a1", "b2", "c3"), "conv-1"
    ),
]
FRONTEND_CSV = """\
timestamp,model,input_tokens,output_tokens,sampling_params
2026-11-23T00:50:50.123Z,SmolLM2-135M-Instruct,31,10,"{""max_tokens"": 10, ""temperature"": 0}"
2026-11-23T00:50:49.000Z,SmolLM2-135M-Instruct,7,3,"{""top_p"": 0.9, ""max_completion_tokens"": 64}"
"""
BURSTGPT_CSV = """\
Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,GPT-4,1087,0,1087,API log
118,ChatGPT,417,276,693,Conversation log
"""
AZURE_CSV = """\
TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
"""
MOONCAKE_JSONL = """\
{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49]}
{"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46, 52, 53]}
"""
LEGACY_CSV = "arrival,input,output,model\n0.5,200,20,1\n0.0,100,10,0\n"
LOADGEN_JSONL = (
    '{"timestamp": 1004.0, "prompt_tokens": 20, "completion_tokens": 6}\n'
    '{"timestamp": 1002.0, "input_len": 30, "output_len": 7}\n'
)


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_our_csv_and_jsonl_read_the_same_records(tmp_path: Path) -> None:
    assert read_trace(_file(tmp_path, "t.csv", OURS_CSV)) == OURS
    assert read_trace(_file(tmp_path, "t.jsonl", OURS_JSONL)) == OURS
    assert OURS_CSV.splitlines()[0].split(",") == list(CSV_COLUMNS)


def test_the_frontends_earlier_export(tmp_path: Path) -> None:
    records = read_trace(_file(tmp_path, "export.csv", FRONTEND_CSV))
    assert records == [
        TraceRecord(1795395049.0, "SmolLM2-135M-Instruct", 7, 3, top_p=0.9, max_tokens=64),
        TraceRecord(1795395050.123, "SmolLM2-135M-Instruct", 31, 10, temperature=0.0, max_tokens=10),
    ]


def test_burstgpt(tmp_path: Path) -> None:
    records = read_trace(_file(tmp_path, "BurstGPT_1.csv", BURSTGPT_CSV))
    assert [(r.timestamp, r.model, r.input_tokens, r.output_tokens) for r in records] == [
        (5.0, "ChatGPT", 472, 18),
        (45.0, "GPT-4", 1087, 0),
        (118.0, "ChatGPT", 417, 276),
    ]


def test_azure_names_its_model_after_the_caller(tmp_path: Path) -> None:
    path = _file(tmp_path, "AzureLLMInferenceTrace_conv.csv", AZURE_CSV)
    records = read_trace(path)
    # Naive timestamps are UTC; the seventh fractional digit is below a microsecond.
    assert [r.timestamp for r in records] == pytest.approx([1700158546.68059, 1700158550.995169])
    assert [(r.model, r.input_tokens, r.output_tokens) for r in records] == [
        ("azure", 374, 44),
        ("azure", 396, 109),
    ]
    assert {r.model for r in read_trace(path, model="gpt-4")} == {"gpt-4"}


def test_mooncake_milliseconds_and_hash_ids(tmp_path: Path) -> None:
    records = read_trace(_file(tmp_path, "mooncake_trace.jsonl", MOONCAKE_JSONL))
    assert records[0] == TraceRecord(27.482, "mooncake", 6955, 52, prefix_hashes=("2e", "2f", "30", "31"))
    assert records[1].prefix_hashes == ("2e", "34", "35") and records[1].timestamp == 30.535


def test_old_scheduler_and_load_generator_files(tmp_path: Path) -> None:
    legacy = read_trace(_file(tmp_path, "trace.csv", LEGACY_CSV))
    assert [(r.timestamp, r.model, r.input_tokens) for r in legacy] == [(0.0, "0", 100), (0.5, "1", 200)]
    as_json = _file(tmp_path, "trace.jsonl", '{"arrival": 1.5, "input": 9, "output": 4}\n')
    assert read_trace(as_json) == [TraceRecord(1.5, "0", 9, 4)]
    loadgen = read_trace(_file(tmp_path, "old.jsonl", LOADGEN_JSONL), model="m")
    assert loadgen == [TraceRecord(1002.0, "m", 30, 7), TraceRecord(1004.0, "m", 20, 6)]


@pytest.mark.parametrize(
    "name, text, fmt",
    [
        ("a.csv", OURS_CSV, "opentela"),
        ("a.jsonl", OURS_JSONL, "opentela"),
        ("a.csv", FRONTEND_CSV, "frontend"),
        ("a.csv", BURSTGPT_CSV, "burstgpt"),
        ("a.csv", AZURE_CSV, "azure"),
        ("a.jsonl", MOONCAKE_JSONL, "mooncake"),
        ("a.csv", LEGACY_CSV, "legacy"),
        # The content decides, not the file's name.
        ("a.txt", MOONCAKE_JSONL, "mooncake"),
        ("a.jsonl", BURSTGPT_CSV, "burstgpt"),
    ],
)
def test_auto_detection_matches_the_forced_format(tmp_path: Path, name: str, text: str, fmt: str) -> None:
    path = _file(tmp_path, name, "\n" + text)  # a leading blank line is no header
    assert read_trace(path) == read_trace(path, fmt)


def test_gzip_byte_order_mark_and_empty_files(tmp_path: Path) -> None:
    packed = tmp_path / "t.csv.gz"
    packed.write_bytes(gzip.compress(BURSTGPT_CSV.encode()))
    assert read_trace(packed) == read_trace(_file(tmp_path, "t.csv", BURSTGPT_CSV))
    assert read_trace(_file(tmp_path, "bom.csv", "\ufeff" + AZURE_CSV)) == read_trace(
        _file(tmp_path, "plain.csv", AZURE_CSV)
    )
    assert read_trace(_file(tmp_path, "empty.jsonl", "\n\n")) == []
    assert read_trace(_file(tmp_path, "header.csv", ",".join(CSV_COLUMNS) + "\n")) == []
    out = tmp_path / "again.jsonl.gz"
    assert write_trace(OURS, out) == 2
    assert read_trace(out) == OURS


@pytest.mark.parametrize(
    "text, fmt, message",
    [
        (
            "timestamp,model,input_tokens,output_tokens\n1,m,10,5\n2,m,ten,5\n",
            "auto",
            ":3: input_tokens must be",
        ),
        (
            "timestamp,model,input_tokens,output_tokens\n1,m,10\n",
            "auto",
            ":2: 3 cells where the header has 4",
        ),
        ("timestamp,model,input_tokens,output_tokens\n1,m,-1,5\n", "auto", ":2: token counts must be >= 0"),
        (
            "timestamp,model,input_tokens,output_tokens\n1,m,1.5,5\n",
            "auto",
            ":2: input_tokens must be a whole",
        ),
        ("timestamp,model,input_tokens,output_tokens\nnan,m,1,5\n", "auto", ":2: timestamp must be finite"),
        (
            '{"timestamp": 1, "input_tokens": 1, "output_tokens": 1}\n{"timestamp": 2,\n',
            "auto",
            ":2: not a JSON",
        ),
        ("[1, 2]\n", "auto", ":1: expected a JSON object, found list"),
        ('{"timestamp": 1}\n', "auto", ":1: input_tokens is missing"),
        (
            '{"timestamp": 1, "input_length": 3, "output_length": 1, "hash_ids": [-1]}\n',
            "auto",
            ":1: hash_ids",
        ),
        ("when,prompt,answer\n1,2,3\n", "auto", ":1: unknown trace header 'when,prompt,answer'"),
        ("Timestamp,Model,Request tokens\n1,m,2\n", "burstgpt", ":1: not in the burstgpt format"),
        ("arrival,input\n0.0,100\n", "auto", "each row needs arrival, input, output"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n",
            "auto",
            ":2: timestamp must be seconds or",
        ),
        (BURSTGPT_CSV, "mooncake", ":1: the mooncake format is JSON lines, but this file is CSV"),
        (MOONCAKE_JSONL, "azure", ":1: the azure format is CSV, but this file is JSON lines"),
        (BURSTGPT_CSV, "sharegpt", "unknown trace format 'sharegpt'"),
        ('a,"b\n', "legacy", "not in the legacy format"),
    ],
)
def test_bad_input_is_a_config_error_naming_file_and_line(
    tmp_path: Path, text: str, fmt: str, message: str
) -> None:
    path = _file(tmp_path, "bad.trace", text)
    with pytest.raises(ConfigError) as info:
        read_trace(path, fmt)
    assert message in str(info.value)
    if message.startswith(":"):
        assert str(info.value).startswith(f"{path}:")


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read trace"):
        read_trace(tmp_path / "missing.csv")
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="cannot read trace"):
        read_trace(tmp_path / "binary.csv")
    with pytest.raises(ConfigError, match=r"name it \.csv or \.jsonl"):
        write_trace(OURS, tmp_path / "trace.parquet")


def test_choosing_and_renaming_models() -> None:
    records = [TraceRecord(0, "a", 1, 1), TraceRecord(1, "b", 1, 1), TraceRecord(2, "c", 1, 1)]
    assert select_models(records, {}) == records
    assert select_models(records, parse_model_map(["a", "c=Qwen3-1.7B"])) == [
        TraceRecord(0, "a", 1, 1),
        TraceRecord(2, "Qwen3-1.7B", 1, 1),
    ]
    with pytest.raises(ConfigError, match="NAME or NAME=MODEL"):
        parse_model_map(["=x"])


def test_the_load_generator_replays_any_format(tmp_path: Path) -> None:
    path = _file(tmp_path, "burst.csv", BURSTGPT_CSV)
    plan = trace_plan(path, speedup=2, models={"ChatGPT": "ChatGPT"})
    # Shifted to start at 0, sped up, the other model's requests left out, a 0-token answer asks for 1.
    assert plan == [PlannedRequest(0.0, 472, 18), PlannedRequest(56.5, 417, 276)]
    assert trace_plan(path)[1] == PlannedRequest(40.0, 1087, 1)
    with pytest.raises(ConfigError, match="no requests of the chosen models"):
        trace_plan(path, models={"Claude": "Claude"})
