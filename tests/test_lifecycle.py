"""Every run ends with a status: finished, failed, or interrupted with what it measured; one run per folder."""

import json
import signal
import subprocess
import sys
import time

import pytest

import harness.__main__ as entry
from harness.analysis.results import FolderInUse, RunStatus, claim_run_folder, read_status
from tests.conftest import ROOT

SMALL = ["workload=synthetic", "workload.num_requests=3", "workload.prompt={dist: fixed, value: 8}",
         "workload.output={dist: fixed, value: 4}", "progress=false"]


def cli(*overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *overrides], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


# SIGTERM takes the same path as SIGINT (one handler, its own exit code): it runs with -m slow.
@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130),
                                         pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow)])
def test_an_interrupted_run_writes_what_it_measured_and_says_so(signum, code, tmp_path):
    run = subprocess.Popen([sys.executable, "-m", "harness", "workload=synthetic", "workload.num_requests=3000",
                            "workload.arrival=offline", "progress=false", f"hydra.run.dir={tmp_path}"],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "__main__.log"
    deadline = time.monotonic() + 120
    while not (log.exists() and "workload source" in log.read_text()):  # logged just before the replay starts
        assert time.monotonic() < deadline and run.poll() is None, run.communicate()
        time.sleep(0.1)
    time.sleep(1.0)
    run.send_signal(signum)
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == code
    # One line says what happened; a second may say the machine was busy meanwhile (the measurement's own warning).
    said = [line for line in stderr.strip().splitlines() if not line.startswith("warning: the machine was not quiet")]
    assert "Traceback" not in stderr and len(said) == 1, stderr
    assert f"interrupted by {signal.Signals(signum).name}" in said[0]
    status = read_status(tmp_path)
    assert status["status"] == RunStatus.INTERRUPTED
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["partial"] is True and 0 < summary["num_requests"] <= 3000
    assert summary["num_finished"] + summary["num_rejected"] + summary["num_unfinished"] == summary["num_requests"]


def test_a_second_run_into_a_folder_in_use_is_refused(tmp_path):
    with claim_run_folder(tmp_path, {}):
        refused = cli(*SMALL, f"hydra.run.dir={tmp_path}")
        assert refused.returncode == 1
        assert "is in use by another run (pid" in refused.stderr and "Traceback" not in refused.stderr
        assert read_status(tmp_path)["status"] == RunStatus.RUNNING  # the holder's status stays
    with pytest.raises(FolderInUse), claim_run_folder(tmp_path, {}), claim_run_folder(tmp_path, {}):
        pass


def test_a_rerun_clears_the_old_results_first(tmp_path):
    assert cli(*SMALL, f"hydra.run.dir={tmp_path}").returncode == 0
    assert read_status(tmp_path)["status"] == RunStatus.FINISHED and (tmp_path / "summary.json").exists()
    failed = cli(*SMALL, "kv_cache.num_blocks=1", f"hydra.run.dir={tmp_path}")
    assert failed.returncode == 1 and failed.stderr.startswith("error: kv_cache.num_blocks=1 cannot hold")
    assert read_status(tmp_path)["status"] == RunStatus.FAILED
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "requests.csv").exists()


def test_a_bug_ends_in_one_line_and_a_status_with_the_traceback(tmp_path, monkeypatch, capsys):
    def broken(cfg, run_dir):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("harness.job.run_job", broken)  # imported by the entry point when it runs
    monkeypatch.setattr(entry, "validate", lambda cfg: cfg)  # a config it takes: the bug is the job's
    with claim_run_folder(tmp_path, {}), pytest.raises(SystemExit) as exit_:
        entry._run({}, tmp_path, {"strategy": "static"}, in_sweep=False)
    assert str(exit_.value) == f"error: ZeroDivisionError: a bug (the traceback is in {tmp_path / 'status.json'})"
    status = read_status(tmp_path)
    assert status["status"] == RunStatus.FAILED and "ZeroDivisionError" in status["traceback"]
    assert status["strategy"] == "static"


def test_a_whole_distribution_can_be_replaced_from_the_command_line(tmp_path):
    result = cli(*SMALL, f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    requests = (tmp_path / "requests.csv").read_text().splitlines()
    assert len(requests) == 4 and all(",8,4," in line for line in requests[1:])  # prompt_len 8, max_new_tokens 4
