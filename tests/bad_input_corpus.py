"""Runs the bad-input corpus (`fixtures/bad_inputs.yaml`) through the command line and classifies each answer:
`clear` (one line, non-zero exit, no traceback, the expected words; for config errors no model loaded),
`accepted` (a case that must run, ran, and shows its documented meaning), `traceback`, `silent` (exit 0 where an
error was due), or `unclear` (one line but not the expected one).

The test suite runs each case; `python -m tests.bad_input_corpus [--root CHECKOUT]` prints the counts for any
checkout (the closing note's before/after).
"""

import argparse
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import yaml

CORPUS = Path(__file__).parent / "fixtures" / "bad_inputs.yaml"
ROOT = Path(__file__).resolve().parents[1]


def load_cases(path: Path = CORPUS) -> list[dict]:
    corpus = yaml.safe_load(path.read_text())
    cases = []
    for case in corpus["cases"]:
        args = []
        for arg in case["args"]:
            args += corpus["defaults"].get(arg, [arg])
        cases.append(case | {"args": args})
    return cases


def run_case(case: dict, root: Path = ROOT, python: str = sys.executable, aliases: dict | None = None,
             loose: bool = False) -> dict:
    """Run one case in a scratch folder; returns its exit code, output and class."""
    with tempfile.TemporaryDirectory() as scratch:
        for name, text in case.get("files", {}).items():
            (Path(scratch) / name).write_text(text)
        run_dir = Path(scratch) / "run"
        args = [a.replace("{dir}", scratch) for a in case["args"]]
        command = case.get("command", "harness")
        command = (aliases or {}).get(command, command)
        if command == "harness":
            args.append(f"hydra.run.dir={run_dir}")
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the tests set it; users do not
        done = subprocess.run([python, "-m", command, *args], cwd=root, env=env, capture_output=True, text=True,
                              timeout=300)
        requests = run_dir / "requests.csv"
        table = requests.read_text() if requests.exists() else ""
    return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr, "requests": table,
            "class": classify(case, done, table, loose)}


def classify(case: dict, done: subprocess.CompletedProcess, requests_table: str, loose: bool = False) -> str:
    """`loose` takes any one-line answer for clear, whatever its words (to count an older checkout fairly)."""
    if "Traceback" in done.stderr or "Traceback" in done.stdout:
        return "traceback"
    if "accepted" in case:
        return "accepted" if done.returncode == 0 and case["accepted"] in requests_table else "unclear"
    if done.returncode == 0:
        return "silent"
    lines = done.stderr.strip().splitlines()
    loaded = case.get("config") and "loading model" in done.stdout + done.stderr
    if len(lines) == 1 and (loose or case["expect"] in lines[0]) and not loaded:
        return "clear"
    return "unclear"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to run (its own python -m harness)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--alias", action="append", default=[], help="COMMAND=MODULE, for older checkouts")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--loose", action="store_true", help="any one-line error counts as clear")
    args = parser.parse_args()
    aliases = dict(a.split("=", 1) for a in args.alias)
    counts = Counter()
    for case in load_cases(args.corpus):
        result = run_case(case, args.root, args.python, aliases, args.loose)
        counts[result["class"]] += 1
        tail = (result["stderr"].strip().splitlines() or [""])[-1][:110]
        print(f"{result['class']:9s} {case['id']:34s} exit {result['returncode']:3d}  {tail}")
    print(f"{sum(counts.values())} cases: " + ", ".join(f"{n} {k}" for k, n in counts.most_common()))


if __name__ == "__main__":
    main()
