"""Run inside the NeMo Gym venv: Gym's own reader over a capture directory, as JSON on stdout.

    python gym_reader.py CAPTURE_DIR ROLLOUT_ID...   ->  {rollout_id: {records, metrics, merged}}
    python gym_reader.py --load-config FILE          ->  what Gym's config loader made of FILE
    python gym_reader.py --records-store DIR ID...   ->  Gym's reader over a `records.CaptureStore`

Reads with Gym's `read_available_model_call_records` (its tolerant reader: the one its collector
uses), `read_model_call_records` and `aggregate_model_call_metrics` (strict: they raise on a torn
line, reported as ``"raises"``) and `merge_model_call_capture_into_record`; nothing of this
project is imported here, but by ``--records-store``, which checks that `records` is a drop-in
for Gym's store (`records` must then be importable in Gym's venv).
"""

import json
import sys
from pathlib import Path


def read(capture_dir: str, rollout_ids: list[str]) -> dict:
    from nemo_gym.base_responses_api_model import (
        CaptureStore,
        aggregate_model_call_metrics,
        merge_model_call_capture_into_record,
        read_available_model_call_records,
        read_model_call_records,
    )

    store = CaptureStore(capture_dir)
    out = {}
    for rollout_id in rollout_ids:
        records, unreadable = read_available_model_call_records(store, rollout_id)
        merged = merge_model_call_capture_into_record({"_ng_rollout_id": rollout_id}, [Path(capture_dir)])
        out[rollout_id] = {"records": [r.model_dump(mode="json") for r in records], "unreadable": unreadable,
                           "strict": _or_raises(lambda rollout_id=rollout_id: len(read_model_call_records(store, rollout_id))),
                           "metrics": _or_raises(lambda rollout_id=rollout_id: aggregate_model_call_metrics(store, rollout_id)),
                           "merged": merged["ng_model_call_capture"]}
    return out


def _or_raises(compute):
    try:
        return compute()
    except Exception as exc:
        return {"raises": type(exc).__name__}


def load_config(path: str) -> dict:
    from omegaconf import DictConfig, OmegaConf

    from nemo_gym.base_responses_api_model import model_call_capture_dirs_from_config
    from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig

    config = GlobalConfigDictParser().parse(GlobalConfigDictParserConfig(
        initial_global_config_dict=DictConfig({"config_paths": [path]}),
        skip_load_from_cli=True, skip_load_from_dotenv=True, offline=True))
    return {"capture_dirs": [str(p) for p in model_call_capture_dirs_from_config(config)],
            "config": OmegaConf.to_container(config, resolve=True)}


def read_records_store(capture_dir: str, rollout_ids: list[str]) -> dict:
    """Gym's own `read_available_model_call_records` given `records.CaptureStore` (issue 23)."""
    import records
    from nemo_gym.base_responses_api_model import read_available_model_call_records

    store = records.CaptureStore(capture_dir)
    out = {}
    for rollout_id in rollout_ids:
        calls, unreadable = read_available_model_call_records(store, rollout_id)
        out[rollout_id] = {"records": [r.model_dump(mode="json") for r in calls], "unreadable": unreadable}
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--load-config":
        result = load_config(sys.argv[2])
    elif sys.argv[1] == "--records-store":
        result = read_records_store(sys.argv[2], sys.argv[3:])
    else:
        result = read(sys.argv[1], sys.argv[2:])
    json.dump(result, sys.stdout, default=str)
