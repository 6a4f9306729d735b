#!/usr/bin/env bash
# Point every Gym server venv of deploy/gym's configs at one prepared venv (deploy/gym/README.md,
# "Install"): Gym runs each server from <uv_venv_dir>/<type>/<name>/.venv and, with
# +skip_venv_if_present=true, uses one it finds there instead of building it with uv.
#
#   deploy/gym/link_venvs.sh VENV VENVS_DIR
#
# VENV: a venv with nemo-gym==0.7.0 and model-call-capture installed. VENVS_DIR: what you pass
# to Gym as +uv_venv_dir=VENVS_DIR.
set -euo pipefail
if [ $# -ne 2 ] || [ ! -x "$1/bin/python" ]; then
  echo "usage: $0 VENV VENVS_DIR   (VENV/bin/python must exist)" >&2
  exit 2
fi
venv=$(cd "$1" && pwd)
for server in responses_api_agents/mcc_sdk_agent environment_servers/legacy_agent \
              resources_servers/string_match responses_api_models/vllm_model; do
  mkdir -p "$2/$server"
  ln -sfn "$venv" "$2/$server/.venv"
done
echo "linked 4 Gym server venvs under $2 to $venv"
