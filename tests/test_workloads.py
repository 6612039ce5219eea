"""Workload sources: determinism, the embedded profile's labelling, ShareGPT sampling and its clear errors."""

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from tests.conftest import ROOT, SHARED_DATA
from workloads import WorkloadError, build_workload
from workloads.arrivals import arrival_times
from workloads.describe import workload_stats

FIXTURE = ROOT / "tests" / "fixtures" / "sharegpt_small.json"


def workload_cfg(name: str, **overrides):
    """A workload config as the conf file has it; an override replaces its key whole (a distribution too)."""
    cfg = OmegaConf.load(ROOT / "conf" / "workload" / f"{name}.yaml")
    cfg.seed = 0
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


@pytest.mark.parametrize("name", ["synthetic", "sharegpt"])
def test_the_same_seed_gives_the_same_workload(name):
    a = build_workload(workload_cfg(name, arrival="poisson", rate=4.0), vocab_size=1000)
    b = build_workload(workload_cfg(name, arrival="poisson", rate=4.0), vocab_size=1000)
    c = build_workload(workload_cfg(name, arrival="poisson", rate=4.0, seed=1), vocab_size=1000)
    assert a.requests == b.requests
    assert a.requests != c.requests
    assert all(max(r.prompt_ids) < 1000 for r in a.requests)
    times = [r.arrival_s for r in a.requests]
    assert times == sorted(times) and times[0] == 0.0


def test_the_embedded_sharegpt_profile_says_it_is_a_profile():
    workload = build_workload(workload_cfg("sharegpt", num_requests=500), vocab_size=8192)
    assert "profile" in workload.info["source"] and "not the real data set" in workload.info["source"]
    prompts = np.array([r.prompt_len for r in workload.requests])
    outputs = np.array([r.max_new_tokens for r in workload.requests])
    assert prompts.min() >= 4 and prompts.max() <= 1024 and (prompts + outputs).max() <= 2048
    assert 100 < prompts.mean() < 250 and 250 < outputs.mean() < 420  # the profile's published means: 169, 338


def test_sharegpt_file_is_sampled_and_tokenised_offline():
    workload = build_workload(workload_cfg("sharegpt", path=str(FIXTURE), num_requests=10), vocab_size=8192)
    # 5 conversations: one has a single turn, one a 1-token prompt ("hi"); three usable.
    assert len(workload.requests) == 3
    assert workload.info["dropped"] == {"fewer than two turns": 1, "prompt or completion under 4 tokens": 1}
    assert "cl100k_base" in workload.info["tokenizer"]
    assert all(r.max_new_tokens >= 4 for r in workload.requests)


@pytest.mark.parametrize("content,message", [
    ("not json at all", "is not valid JSON"),
    ('{"conversations": []}', "expected a JSON list"),
    ('[{"id": 1, "turns": []}]', "entry 0: expected"),
    ('[{"conversations": [{"from": "human", "value": "only one"}]}]', "1 with fewer than two turns"),
])
def test_bad_sharegpt_files_get_one_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(WorkloadError, match=message):
        build_workload(workload_cfg("sharegpt", path=str(path)), vocab_size=100)


def test_a_missing_file_is_named():
    with pytest.raises(WorkloadError, match="does not exist"):
        build_workload(workload_cfg("sharegpt", path="/no/such/file.json"), vocab_size=100)


@pytest.mark.skipif(not (SHARED_DATA / "sharegpt").is_dir(), reason="../shared/data is not here")
def test_real_sharegpt_prompts_without_completions_get_the_two_turns_answer():
    path = SHARED_DATA / "sharegpt" / "ShareGPT_V3_filtered_1000.json"
    with pytest.raises(WorkloadError, match="no usable conversation among 1000 .*1000 with fewer than two turns"):
        build_workload(workload_cfg("sharegpt", path=str(path)), vocab_size=8192)


def test_rate_based_arrivals_need_a_positive_rate_and_no_rate_means_all_at_once():
    with pytest.raises(WorkloadError, match="workload.rate should be greater than 0, got 0"):
        build_workload(workload_cfg("synthetic", rate=0), vocab_size=100)
    assert arrival_times("gamma", 5, np.random.default_rng(0), rate=None).tolist() == [0.0] * 5


def test_gamma_arrivals_have_the_asked_rate_and_burstiness():
    times = arrival_times("gamma", 20_000, np.random.default_rng(0), rate=4.0, burstiness=0.25)
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / 4.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(0.25), rel=0.05)


def test_profile_file_is_lengths_only():
    profile = json.loads((ROOT / "workloads" / "profiles" / "sharegpt.json").read_text())
    assert set(profile) == {"provenance", "prompt", "output"}
    assert all(isinstance(v, int) for v in profile["prompt"]["values"])


def trace_cfg(name: str, **overrides):
    return workload_cfg(name, path=str(ROOT / "tests" / "fixtures" / f"{name}_small.{FIXTURE_EXT[name]}"),
                        **overrides)


FIXTURE_EXT = {"azure": "csv", "burstgpt": "csv", "mooncake": "jsonl"}


@pytest.mark.parametrize("name,count", [("azure", 12), ("burstgpt", 11), ("mooncake", 6)])
def test_traces_replay_their_own_timestamps(name, count):
    workload = build_workload(trace_cfg(name), vocab_size=1000)
    assert len(workload.requests) == count
    times = np.array([r.arrival_s for r in workload.requests])
    assert times[0] == 0.0 and (np.diff(times) >= 0).all() and times[-1] > 0
    faster = build_workload(trace_cfg(name, time_scale=0.5), vocab_size=1000)
    assert [r.arrival_s for r in faster.requests] == pytest.approx(list(times * 0.5))


def test_burstgpt_drops_failed_rows_and_filters_by_model():
    workload = build_workload(trace_cfg("burstgpt"), vocab_size=1000)
    assert workload.info["dropped"] == {"zero request or response tokens": 1}
    gpt4 = build_workload(trace_cfg("burstgpt", model="GPT-4"), vocab_size=1000)
    assert len(gpt4.requests) == 4
    with pytest.raises(WorkloadError, match="zero requests after the model filter 'Claude'"):
        build_workload(trace_cfg("burstgpt", model="Claude"), vocab_size=1000)


def test_mooncake_hash_ids_give_shared_prefixes():
    requests = build_workload(trace_cfg("mooncake"), vocab_size=1000).requests
    assert [r.prompt_len for r in requests] == [700, 300, 1100, 520, 60, 1030]
    assert requests[0].prompt_ids[:700] == requests[2].prompt_ids[:700]  # hash ids [0, 1] in both
    assert requests[2].prompt_ids[:1024] == requests[5].prompt_ids[:1024]
    assert requests[2].prompt_ids[1024:1030] != requests[5].prompt_ids[1024:1030]  # block 2 vs block 12
    assert requests[1].prompt_ids[:300] != requests[0].prompt_ids[:300]


@pytest.mark.parametrize("name", ["azure", "burstgpt", "mooncake"])
def test_a_time_window_selects_the_trace_requests_in_it(name):
    whole = build_workload(trace_cfg(name, arrival="trace"), vocab_size=1000)
    stamps = np.array([r.arrival_s for r in whole.requests])
    start, duration = stamps[1], (stamps[-1] - stamps[1]) / 2
    window = build_workload(trace_cfg(name, start_s=float(start), duration_s=float(duration)), vocab_size=1000)
    inside = [r for r in whole.requests if start <= r.arrival_s < start + duration]
    assert [(r.prompt_len, r.max_new_tokens) for r in window.requests] == [(r.prompt_len, r.max_new_tokens)
                                                                            for r in inside]
    assert [r.arrival_s for r in window.requests] == pytest.approx([r.arrival_s - start for r in inside])
    first_two = build_workload(trace_cfg(name, start_s=float(start), num_requests=2), vocab_size=1000)
    assert [r.prompt_len for r in first_two.requests] == [r.prompt_len for r in inside[:2]]
    with pytest.raises(WorkloadError, match="has no request between"):
        build_workload(trace_cfg(name, start_s=float(stamps[-1]) + 1.0), vocab_size=1000)


def test_trace_sampling_and_clamps():
    first = build_workload(trace_cfg("azure", num_requests=4), vocab_size=1000).requests
    sampled = build_workload(trace_cfg("azure", num_requests=4, sample="random"), vocab_size=1000).requests
    assert len(first) == len(sampled) == 4 and first != sampled
    assert all(np.diff([r.arrival_s for r in sampled]) >= 0)
    clamped = build_workload(trace_cfg("azure", max_prompt_len=50, max_output_len=10), vocab_size=1000).requests
    assert max(r.prompt_len for r in clamped) == 50 and max(r.max_new_tokens for r in clamped) == 10


@pytest.mark.parametrize("name,content,message", [
    ("azure", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n", r"lacks column\(s\) \['GeneratedTokens'\]"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,x\n",
     "data row 1: GeneratedTokens = x is not a whole number >= 1"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n", "data row 1: TIMESTAMP 'yesterday'"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4\n2023-11-16 18:15:40,3,4\n",
     "data row 2: timestamp goes back in time"),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens\n1,ChatGPT,-4,5\n",
     "data row 1: Request tokens = -4 is not a whole number >= 0"),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens\n", "zero requests"),
    ("mooncake", '{"timestamp": 0, "input_length": 5}\n', "line 1: expected a JSON object"),
    ("mooncake", '{"timestamp": 5, "input_length": 5, "output_length": 1}\n'
                 '{"timestamp": 1, "input_length": 5, "output_length": 1}\n', "timestamp goes back in time"),
    ("mooncake", '{"timestamp": 0, "input_length": 0, "output_length": 1}\n', "input_length = 0 is not a whole number"),
])
def test_bad_traces_get_one_clear_error_naming_file_and_row(tmp_path, name, content, message):
    path = tmp_path / f"bad.{FIXTURE_EXT[name]}"
    path.write_text(content)
    with pytest.raises(WorkloadError, match=message) as error:
        build_workload(workload_cfg(name, path=str(path)), vocab_size=100)
    assert str(path) in str(error.value)


def test_trace_arrivals_need_timestamps():
    with pytest.raises(WorkloadError, match="arrival=trace needs a source with timestamps"):
        build_workload(workload_cfg("synthetic", arrival="trace"), vocab_size=100)
    with pytest.raises(WorkloadError, match="needs workload.path"):
        build_workload(workload_cfg("azure"), vocab_size=100)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 60),
       dist=st.sampled_from(["uniform", "normal", "lognormal", "exponential"]),
       arrival=st.sampled_from(["offline", "poisson", "gamma", "constant"]),
       low=st.integers(1, 50), span=st.integers(0, 300))
def test_any_synthetic_workload_is_ordered_clamped_and_deterministic(seed, n, dist, arrival, low, span):
    parameters = {"uniform": {"low": low, "high": low + span}, "normal": {"mean": low + span / 2, "std": span / 4 + 1},
                  "lognormal": {"mean": low + span / 2, "sigma": 0.8}, "exponential": {"mean": low + span / 2}}
    spec = {"dist": dist, "min": low, "max": low + span, **parameters[dist]}
    cfg = workload_cfg("synthetic", seed=seed, num_requests=n, arrival=arrival, rate=3.0, burstiness=0.5,
                       prompt=spec, output=spec)
    a, b = build_workload(cfg, vocab_size=500), build_workload(cfg, vocab_size=500)
    assert a.requests == b.requests and len(a.requests) == n
    times = [r.arrival_s for r in a.requests]
    assert times == sorted(times)
    assert all(low <= r.prompt_len <= low + span and low <= r.max_new_tokens <= low + span for r in a.requests)


def test_inspect_prints_statistics_and_saves_a_png(tmp_path):
    out = tmp_path / "w.png"
    result = subprocess.run([sys.executable, "-m", "harness.describe", "workload=synthetic",
                             "workload.arrival=constant", "workload.rate=2", "workload.num_requests=11",
                             "--out", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "arrival rate req/s" in result.stdout and "2.000" in result.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_workload_stats_of_a_known_workload():
    workload = build_workload(workload_cfg("synthetic", num_requests=5, arrival="constant", rate=4.0,
                                           prompt={"dist": "fixed", "value": 10},
                                           output={"dist": "fixed", "value": 3}), vocab_size=50)
    stats = workload_stats(workload)
    assert stats["prompt tokens"] == 50 and stats["output p99"] == 3
    assert stats["arrival rate req/s"] == pytest.approx(4.0) and stats["inter-arrival CV"] == pytest.approx(0.0)


def test_mooncake_hash_ids_name_the_same_pieces_with_or_without_ids():
    with_ids, lengths_only = (build_workload(trace_cfg("mooncake"), vocab_size=1000, with_ids=w).requests
                              for w in (True, False))
    assert [r.prefix_pieces for r in with_ids] == [r.prefix_pieces for r in lengths_only]
    first, third = with_ids[0].prefix_pieces, with_ids[2].prefix_pieces
    assert first[0] == third[0] and first[1][0] == third[1][0]  # hash ids [0, 1] in both
    assert sum(size for _, size in first) == 700 and first[1][1] == 700 - 512  # the last block partly used


def test_a_random_prefix_and_a_system_prompt_are_shared_pieces_with_the_same_ids():
    requests = build_workload(workload_cfg("random", num_requests=4, input_len=8, output_len=4, prefix_len=20,
                                           system_prompt_len=5), vocab_size=1000).requests
    assert all(r.prompt_len == 33 and len(r.prompt_ids) == 33 for r in requests)
    assert len({r.prompt_ids[:25] for r in requests}) == 1 and len({r.prompt_ids for r in requests}) == 4
    assert len({r.prefix_pieces for r in requests}) == 1
    assert [size for _, size in requests[0].prefix_pieces] == [5, 20]
    # Any workload takes a system prompt, and the context check counts it.
    sharegpt = build_workload(workload_cfg("sharegpt", num_requests=6, system_prompt_len=1500), vocab_size=1000,
                              max_model_len=2048)
    assert all(r.prompt_len > 1500 for r in sharegpt.requests)
    assert "beyond_context" in sharegpt.info


def test_each_turn_of_a_conversation_resends_the_conversation_so_far():
    workload = build_workload(workload_cfg("conversation", num_requests=30), vocab_size=1000)
    requests = workload.requests
    assert len(requests) == 30
    for turn in requests:
        if turn.follows is None:
            continue
        before = requests[turn.follows]
        answer = turn.prefix_pieces[len(before.prefix_pieces)]
        assert turn.prefix_pieces[:len(before.prefix_pieces)] == before.prefix_pieces
        assert answer[1] == before.max_new_tokens  # the answer the workload wrote, as long as the turn's output
        assert turn.prompt_ids[:before.prompt_len] == before.prompt_ids
        assert turn.prompt_len == sum(size for _, size in turn.prefix_pieces)
        assert turn.arrival_s == before.arrival_s and turn.think_s == 1.0
    lengths_only = build_workload(workload_cfg("conversation", num_requests=30), vocab_size=1000, with_ids=False)
    assert [(r.prompt_len, r.prefix_pieces, r.follows) for r in lengths_only.requests] == [
        (r.prompt_len, r.prefix_pieces, r.follows) for r in requests]


@pytest.mark.parametrize("overrides,message", [
    ({"turns": {"dist": "fixed", "value": 0}}, "workload.turns.value should be greater than or equal to 1"),
    ({"max_prompt_len": 100}, "would cut a conversation's history"),
    ({"think_s": -1}, "workload.think_s should be greater than or equal to 0"),
    ({"system_prompt_len": -4}, "workload.system_prompt_len should be greater than or equal to 0"),
])
def test_bad_conversation_configs_are_named(overrides, message):
    with pytest.raises(WorkloadError, match=message):
        build_workload(workload_cfg("conversation", **overrides), vocab_size=1000)


def test_sharegpts_own_conversations_replay_turn_by_turn_with_their_own_answers():
    cfg = workload_cfg("sharegpt_chat", path=str(ROOT / "tests" / "fixtures" / "sharegpt_chat.json"),
                       num_requests=10)
    workload = build_workload(cfg, vocab_size=1000)
    requests = workload.requests
    assert len(requests) == 5  # 3 + 2 turns: a conversation ends at its first message without an answer
    assert workload.info["dropped"] == {"no human message with an answer": 2}
    assert "asked for 10 turns" in workload.info["note"]
    for turn in requests:
        if turn.follows is not None:
            before = requests[turn.follows]
            assert turn.prompt_ids[:before.prompt_len] == before.prompt_ids  # the conversation so far, resent
            answer_len = turn.prefix_pieces[len(before.prefix_pieces)][1]
            assert answer_len == before.max_new_tokens  # the data set's answer, as long as the turn's output
    assert sorted(r.follows is None for r in requests) == [False, False, False, True, True]
    with pytest.raises(WorkloadError, match="a ShareGPT file gives the turns and their lengths: leave out turns"):
        build_workload(workload_cfg("conversation", path="x.json"), vocab_size=1000)
