"""Run folders wherever they are: sweep jobs named safely for any value (a URL, a model path), and every tool that
takes run folders (`compare`, `calibrate`, `fidelity --measured`) finding them at any depth, or saying it found none."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis.results import find_run_folders
from harness.config import MAX_FOLDER_NAME, folder_name
from harness.model_spec import described_model
from harness.peers.server import word_tokenizer
from harness.sim.measured import MeasuredRunError, load_measured_runs
from tests.conftest import ROOT


def harness(*args: str, module: str = "harness", timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("overrides,name", [
    ("runner.url=http://host:8000/v1,workload.max_concurrency=4",
     "runner.url=http:%2F%2Fhost:8000%2Fv1,workload.max_concurrency=4"),
    ("model.name=/path/to/model", "model.name=%2Fpath%2Fto%2Fmodel"),
    ("workload.rate=4", "workload.rate=4"),
    ("", "defaults"),
])
def test_a_job_folder_name_is_one_readable_folder_for_any_value(overrides, name):
    assert folder_name(overrides) == name


def test_folder_names_stay_distinct_and_within_the_file_systems_limit():
    assert folder_name("a=x/y") != folder_name("a=x%2Fy")  # `%` is encoded too: no two values share a name
    long_names = {folder_name(f"model.name=/{'d' * 300}/{i}") for i in range(3)}
    assert len(long_names) == 3 and all(len(n.encode()) <= MAX_FOLDER_NAME and "/" not in n for n in long_names)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """Llama-2-7B described by a folder of its own (config and a tokenizer), as `model=hf model.name=<path>`."""
    folder = tmp_path_factory.mktemp("models") / "llama-2-7b"
    config = described_model("llama-2-7b")
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    word_tokenizer(config["vocab_size"]).save_pretrained(folder)
    return folder


def test_a_sweep_over_a_model_path_keeps_its_jobs_compares_and_calibrates(model_folder, tmp_path):
    sweep = tmp_path / "sweep"
    result = harness("-m", "runner=sim", "runner.hardware=h100", "model=hf", f"model.name={model_folder}",
                     "model.weights=random", "workload=random", "workload.input_len=256", "workload.output_len=64",
                     "workload.num_requests=24", "workload.max_concurrency=2,8", "progress=false",
                     f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.stderr[-2000:]
    jobs = [p for p in sweep.iterdir() if (p / "status.json").is_file()]
    assert len(jobs) == 2 and all("%2F" in p.name for p in jobs)  # one folder each, right under the sweep
    comparison = pd.read_csv(sweep / "comparison.csv")
    assert len(comparison) == 2 and (comparison.status == "finished").all()
    assert set(comparison.run) == {p.name for p in jobs}
    out = tmp_path / "calibration.yaml"
    # The runs' model is the folder itself (model=hf): calibrate reads its config.json, no catalogue name needed.
    fitted = harness(str(sweep), "--setup", "hardware=h100", "--evaluations", "40", "--out", str(out),
                     module="harness.sim.calibrate")
    assert fitted.returncode == 0, fitted.stderr[-2000:]
    assert all(p.name in fitted.stdout for p in jobs) and out.is_file()


def test_tools_find_run_folders_at_any_depth_and_say_when_there_are_none(model_folder, tmp_path):
    # The layout an older sweep left for a value with `/`: job folders nested two levels down.
    nested = tmp_path / "sweep" / "runner.url_http:" / "host:8000"
    for concurrency in (2, 8):
        run = harness("runner=sim", "runner.hardware=h100", "model=llama-2-7b", "workload=random",
                      "workload.input_len=128", "workload.output_len=32", "workload.num_requests=12",
                      f"workload.max_concurrency={concurrency}", "progress=false",
                      f"hydra.run.dir={nested / f'c{concurrency}'}")
        assert run.returncode == 0, run.stderr[-2000:]
    (tmp_path / "sweep" / "plots").mkdir()  # a folder of the sweep that is no run
    (tmp_path / "sweep" / "model").mkdir()  # nor is a model's folder, whose JSON files are no benchmark's
    (tmp_path / "sweep" / "model" / "config.json").write_text('{"model_type": "llama"}')
    assert [p.name for p in find_run_folders(tmp_path / "sweep")] == ["c2", "c8"]
    compared = harness(str(tmp_path / "sweep"), "--out", str(tmp_path / "cmp"), module="harness.analysis.compare")
    assert compared.returncode == 0, compared.stderr[-2000:]
    table = pd.read_csv(tmp_path / "cmp" / "comparison.csv")
    assert sorted(table.run) == ["c2", "c8"] and (table.status == "finished").all()
    runs = load_measured_runs([str(tmp_path / "sweep")])
    assert sorted(r.name for r in runs) == ["c2", "c8"] and {r.max_concurrency for r in runs} == {2, 8}
    fidelity = harness("--measured", str(tmp_path / "sweep"), "--out", str(tmp_path / "fid"),
                       module="harness.sim.fidelity")
    assert fidelity.returncode == 0, fidelity.stderr[-2000:]
    assert set(pd.read_csv(tmp_path / "fid" / "fidelity_measured.csv").run) == {"c2", "c8"}

    empty = tmp_path / "empty" / "deeper"
    empty.mkdir(parents=True)
    with pytest.raises(MeasuredRunError, match="holds no measured run at any depth"):
        load_measured_runs([str(tmp_path / "empty")])
    nothing = harness(str(tmp_path / "empty"), "--out", str(tmp_path / "none"), module="harness.analysis.compare")
    assert nothing.returncode == 1 and "error: no run folder in" in nothing.stderr
    calibrate = harness(str(tmp_path / "empty"), module="harness.sim.calibrate")
    assert calibrate.returncode == 1 and calibrate.stderr.strip().splitlines() == [
        f"error: '{tmp_path / 'empty'}' holds no measured run at any depth: no vllm bench JSON and no finished run "
        "folder"]
