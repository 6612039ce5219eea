"""A server the run starts itself (`runner.launch`), on a free loopback port, stopped when the run ends; and the
default model saved as a folder such a server can load.

`tiny-llama` has no tokenizer of its own, so the folder gets a word-level one made here: token i is the word
`t<i>`, so prompt ids become text and come back as the same ids, and every prompt keeps its length exactly.
"""

import contextlib
import json
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def launched_server(command: str, model_path: str, ready_timeout_s: float, log_path: Path, **fields):
    """Start `command` (`{port}`, `{model_path}`, `{python}` (this interpreter) and any of `fields`, the run's
    engine settings such as `{num_blocks}`, filled in), wait until `GET /v1/models` answers, yield its base URL;
    stop it afterwards (SIGTERM, then SIGKILL after 10 s). Raises RuntimeError if it exits or is not ready in
    time, with the tail of its log."""
    port = free_port()
    argv = shlex.split(command.format(port=port, model_path=model_path, **({"python": sys.executable} | fields)))
    url = f"http://127.0.0.1:{port}/v1"
    with open(log_path, "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(process, url, ready_timeout_s, log_path)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(process: subprocess.Popen, url: str, timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"runner.launch: the server exited with code {process.returncode} before it was "
                               f"ready; its log ends: {_tail(log_path)}")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=1.0):
                return
        except OSError:
            pass  # not listening yet, or not serving yet (an HTTP error is an OSError too)
        time.sleep(0.2)
    raise RuntimeError(f"runner.launch: the server was not ready after {timeout_s:g} s "
                       f"(runner.ready_timeout_s); its log ends: {_tail(log_path)}")


def _tail(path: Path, lines: int = 3) -> str:
    """The log's first error line (the root cause, where a server wraps it in later ones), its last lines and
    where the whole log is."""
    text = path.read_text(errors="replace").strip()
    # A line that is an exception, bare or behind a server's log prefix (`(Worker pid=7) ERROR <date> [file:line] `).
    cause = re.search(r"^(?:\(.*?\) )?(?:ERROR \S+ \S+ \[\S+\] )?(\w+(?:Error|Exception): .+)$", text, re.M)
    last = " | ".join(text.splitlines()[-lines:])
    return f"{cause.group(1).strip() + ' ... ' if cause else ''}{last} (the whole log: {path})"


def server_version(url: str) -> str | None:
    """The version a server reports at `GET /version` beside its `/v1` (vLLM does), or None."""
    try:
        with urllib.request.urlopen(url.removesuffix("/").removesuffix("/v1") + "/version", timeout=5) as answer:
            return str(json.loads(answer.read()).get("version")) or None
    except (OSError, ValueError, AttributeError):
        return None


def local_server_pids(url: str) -> tuple[int, ...]:
    """The processes listening on `url`'s port if it is on this machine (loopback), so their CPU time counts as
    the measured system's and not as other work; () for a remote server, or when the system will not say."""
    parsed = urlparse(url)
    if parsed.hostname not in ("localhost", "127.0.0.1", "::1") or parsed.port is None:
        return ()
    try:
        listening = psutil.net_connections(kind="tcp")
    except psutil.Error:
        return ()
    return tuple(sorted({c.pid for c in listening if c.pid and c.status == psutil.CONN_LISTEN
                         and c.laddr and c.laddr.port == parsed.port}))


def word_tokenizer(vocab_size: int):
    """A tokenizer whose token i is the word `t<i>`: ids → text → the same ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="t0", pad_token="t0")


def save_served_model(model, tokenizer, folder: Path) -> Path:
    """`model` and `tokenizer` as a folder `transformers serve` (or vLLM) loads; EOS off, so outputs have the
    lengths asked for."""
    model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
