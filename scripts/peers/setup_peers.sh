#!/usr/bin/env bash
# Creates the peer virtual environments in the repository root from the pinned requirement files:
#   .venv-trl    scripts/peers/requirements-trl.txt    (torch==2.13.0 CPU, trl, transformers)
#   .venv-tunix  scripts/peers/requirements-tunix.txt  (google-tunix, jax, flax)
#   .venv-verl   scripts/peers/requirements-verl.txt   (torch==2.13.0 CPU and what verl's
#                core_algos imports; verl itself comes from a checkout, record_verl_parity.py)
# They are separate because the two peers' dependency sets conflict (google-tunix 0.1.7 needs
# safetensors<0.8, which holds transformers back).
#
#   scripts/peers/setup_peers.sh [all|trl|tunix|verl]     (make peers / make peer-trl / make peer-tunix)
#
# Idempotent: a venv whose stamp file (.venv-NAME/.stamp-peers) holds the hash of its current
# requirement file and interpreter is left alone. When the requirements changed, the venv is
# recreated from scratch (so no package of an older set lingers). PYTHON picks the interpreter
# (default python3.11, as the project's own .venv).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PYTHON="${PYTHON:-python3.11}"

setup_one() {
  local name="$1"
  local req="$HERE/requirements-$name.txt"
  local venv="$ROOT/.venv-$name"
  local stamp="$venv/.stamp-peers"
  local want
  want="$( { cat "$req"; "$PYTHON" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$venv/bin/python" ]]; then
    echo "peers: .venv-$name is up to date (stamp matches $(basename "$req"))"
    return 0
  fi
  if [[ -e "$venv" ]]; then
    echo "peers: .venv-$name is stale or unfinished: recreating it"
    rm -rf -- "$venv"
  fi
  echo "peers: creating .venv-$name from $(basename "$req") with $PYTHON"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  case "$name" in
    trl) "$venv/bin/python" -c 'import torch, transformers, trl, datasets; print("peers: .venv-trl ok: torch", torch.__version__, "transformers", transformers.__version__, "trl", trl.__version__)' ;;
    verl) "$venv/bin/python" -c 'import torch, omegaconf, tensordict, ray, transformers; print("peers: .venv-verl ok: torch", torch.__version__, "transformers", transformers.__version__)' ;;
    tunix) "$venv/bin/python" -c 'import jax, flax, grain, optax, tunix.rl.grpo.grpo_learner; from importlib.metadata import version as v; print("peers: .venv-tunix ok: jax", jax.__version__, "flax", v("flax"), "google-tunix", v("google-tunix"))' ;;
  esac
  echo "$want" > "$stamp"
}

which="${1:-all}"
case "$which" in
  all) setup_one trl; setup_one tunix; setup_one verl ;;
  trl|tunix|verl) setup_one "$which" ;;
  *) echo "usage: $0 [all|trl|tunix|verl]" >&2; exit 2 ;;
esac
