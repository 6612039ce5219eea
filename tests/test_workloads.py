"""Workload sources: determinism, the embedded profile's labelling, ShareGPT sampling and its clear errors."""

import json

import numpy as np
import pytest
from omegaconf import OmegaConf

from tests.conftest import ROOT, SHARED_DATA
from workloads import WorkloadError, build_workload
from workloads.arrivals import arrival_times

FIXTURE = ROOT / "tests" / "fixtures" / "sharegpt_small.json"


def workload_cfg(name: str, **overrides):
    cfg = OmegaConf.load(ROOT / "conf" / "workload" / f"{name}.yaml")
    cfg.seed = 0
    return OmegaConf.merge(cfg, overrides)


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


def test_rate_based_arrivals_need_a_rate():
    with pytest.raises(WorkloadError, match="needs workload.rate > 0"):
        arrival_times("poisson", 10, np.random.default_rng(0), rate=None)


def test_gamma_arrivals_have_the_asked_rate_and_burstiness():
    times = arrival_times("gamma", 20_000, np.random.default_rng(0), rate=4.0, burstiness=0.25)
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / 4.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(0.25), rel=0.05)


def test_profile_file_is_lengths_only():
    profile = json.loads((ROOT / "workloads" / "profiles" / "sharegpt.json").read_text())
    assert set(profile) == {"provenance", "prompt", "output"}
    assert all(isinstance(v, int) for v in profile["prompt"]["values"])
