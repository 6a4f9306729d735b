"""Deployment files a user copies: Kubernetes, compose, NeMo Gym, and the Docker image (issue 7).

No Docker engine runs here, so the image is tested as far as it can be without one: the
Dockerfile's instructions, and its entrypoint run from the built wheel in a clean virtualenv
with the environment the Dockerfile sets.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request

import kubernetes_validate
import pytest
import yaml

from proxy import load_settings
from records import CaptureStore

from tests.compiled_core import has_c_compiler
from tests.processes import read_line

from tests import CHECKOUT

ROOT = CHECKOUT
KUBERNETES = os.path.join(ROOT, "deploy", "kubernetes")
COMPOSE = os.path.join(ROOT, "deploy", "compose")
GYM = os.path.join(ROOT, "deploy", "gym")


def _yaml(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _manifests() -> dict[str, dict]:
    """Every manifest, by its path under deploy/kubernetes."""
    found = {}
    for folder in ("",):
        for name in sorted(os.listdir(os.path.join(KUBERNETES, folder))):
            if name.endswith(".yaml") and name != "kustomization.yaml":
                found[os.path.join(folder, name)] = _yaml(os.path.join(KUBERNETES, folder, name))
    return found


@pytest.mark.parametrize("name", sorted(_manifests()))
def test_manifest_validates_against_the_kubernetes_schema(name):
    kubernetes_validate.validate(_manifests()[name], kubernetes_validate.latest_version(), strict=True)


def _collector_pod() -> dict:
    return _manifests()["collector.yaml"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def test_kustomization_lists_every_manifest_and_the_collector_never_runs_on_its_own():
    """The collector is in the kustomization (its image rewritten with the sidecar's) as a
    suspended CronJob: a Job would run before any rollout exists, and its immutable template would
    make every later apply fail. The NetworkPolicy ships in it too; the sidecar forwards the model
    API only."""
    resources = _yaml(os.path.join(KUBERNETES, "kustomization.yaml"))["resources"]
    assert sorted(resources) == sorted(_manifests()) and "networkpolicy.yaml" in resources
    sidecar = next(container for container in _manifests()["deployment.yaml"]["spec"]["template"]["spec"]["containers"]
                   if any(env["name"] == "MCC_CAPTURE_DIR" for env in container.get("env", ())))
    assert {"name": "MCC_FORWARD", "value": "model-api"} in sidecar["env"]
    assert all(manifest["kind"] != "Job" for name, manifest in _manifests().items() if name in resources)
    collector = _manifests()["collector.yaml"]
    assert collector["kind"] == "CronJob" and collector["spec"]["suspend"] is True


def test_kustomize_renders_every_image_of_ours_registry_qualified():
    """An unqualified `model-call-capture:0.1.0` would be pulled from the default public registry;
    the kustomization names a registry placeholder (`newName`) that both of our images take."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on the PATH: `kubectl kustomize` cannot render deploy/kubernetes here")
    rendered = subprocess.run([kubectl, "kustomize", KUBERNETES], capture_output=True, text=True, check=True).stdout
    images = re.findall(r"^\s*image: (\S+)$", rendered, re.M)
    ours = [image for image in images if "model-call-capture" in image]
    assert len(ours) == 2, images  # the sidecar and the collector
    entry = _yaml(os.path.join(KUBERNETES, "kustomization.yaml"))["images"][0]
    assert set(ours) == {f"{entry['newName']}:{entry['newTag']}"} and "." in entry["newName"].split("/")[0]
    assert [image for image in images if image not in ours] == ["vllm/vllm-openai:v0.32.0"]


def _restricted_violations(pod: dict, container: dict) -> list[str]:
    """What Pod Security's "restricted" profile would refuse in ``container`` (and its pod)."""
    merged = {**(pod.get("securityContext") or {}), **(container.get("securityContext") or {})}
    problems = []
    if merged.get("runAsNonRoot") is not True:
        problems.append("runAsNonRoot")
    if merged.get("runAsUser") == 0:
        problems.append("runAsUser 0")
    if (container.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False:
        problems.append("allowPrivilegeEscalation")
    if ((container.get("securityContext") or {}).get("capabilities") or {}).get("drop") != ["ALL"]:
        problems.append("capabilities.drop [ALL]")
    if (merged.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        problems.append("seccompProfile")
    if merged.get("privileged"):
        problems.append("privileged")
    return problems


def test_sidecar_and_collector_meet_the_restricted_profile_and_can_write_a_fresh_volume():
    deployment, job_pod = _manifests()["deployment.yaml"], _collector_pod()
    pod = deployment["spec"]["template"]["spec"]
    assert _restricted_violations(pod, _sidecar_container(deployment)) == []
    assert _restricted_violations(job_pod, job_pod["containers"][0]) == []
    assert pod["securityContext"]["fsGroup"] == _sidecar_container(deployment)["securityContext"]["runAsGroup"] == 10001


def test_vllm_container_is_pinned_probed_and_has_shared_memory_and_a_model_cache():
    pod = _manifests()["deployment.yaml"]["spec"]["template"]["spec"]
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    assert not vllm["image"].endswith(":latest") and ":" in vllm["image"]
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(vllm)
    mounts = {m["name"]: m["mountPath"] for m in vllm["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["dshm"] == "/dev/shm" and volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert "model-cache" in mounts and "requests" in vllm["resources"]


def _sidecar_container(deployment: dict) -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "model-call-capture")


def test_sidecar_probes_volume_and_grace_period_fit_together():
    manifests = _manifests()
    pod = manifests["deployment.yaml"]["spec"]["template"]["spec"]
    sidecar = _sidecar_container(manifests["deployment.yaml"])
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/-/ready"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    env = {item["name"]: item["value"] for item in sidecar["env"] if "value" in item}
    # The admin token comes from a Secret (never a flag, never a literal in the manifest).
    (token,) = [item for item in sidecar["env"] if item["name"] == "MCC_ADMIN_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"]["name"] == "model-call-capture-admin"
    assert not any("admin-token" in argument for argument in sidecar.get("args", []) + sidecar.get("command", []))
    settings = load_settings(environ=env)
    assert settings.capture_on and pod["terminationGracePeriodSeconds"] > settings.drain_timeout
    assert pod["enableServiceLinks"] is False
    assert {m["mountPath"] for m in sidecar["volumeMounts"]} == {settings.capture_dir, "/tmp"}, "/tmp: --workers' metrics"
    claim = manifests["pvc.yaml"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    job = _collector_pod()
    assert job["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert job["containers"][0]["volumeMounts"][0]["mountPath"] == settings.capture_dir
    service = manifests["service.yaml"]["spec"]
    assert service["ports"][0]["targetPort"] in {p["name"] for p in sidecar["ports"]}, "the Service points at the sidecar"


def test_collector_job_command_runs(tmp_path):
    """The Job's command (`python -m records DIR`) summarises a capture dir."""
    command = _collector_pod()["containers"][0]["command"]
    (tmp_path / "r1.capture.jsonl").write_text('{"model_call_id": "a", "status_code": 200}\n')
    done = subprocess.run([sys.executable, *command[1:-1], str(tmp_path)], capture_output=True, text=True, check=True)
    assert '"rollout_id":"r1"' in done.stdout and '"num_calls":1' in done.stdout


@pytest.mark.parametrize("name", ["compose.yaml", "compose.cpu.yaml"])
def test_compose_files_configure_a_valid_sidecar(name):
    compose = _yaml(os.path.join(COMPOSE, name))
    sidecar = compose["services"]["mcc"]
    settings = load_settings(environ={k: str(v) for k, v in sidecar["environment"].items()})
    assert settings.capture_on and sidecar["volumes"] == [f"model-calls:{settings.capture_dir}"]
    assert "model-calls" in compose["volumes"]


def test_gym_config_turns_capture_on_for_the_sidecar():
    settings = load_settings({"config": os.path.join(GYM, "gym_config.yaml")}, environ={})
    assert settings.capture_on and settings.capture_dir == "/data/model-calls" and settings.upstream == "http://127.0.0.1:8000"


def _load(path: str):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


async def test_gym_harness_and_collector_examples_work_together(start, stand_in, capture_dir):
    """The examples as written, on Gym's real run rows (`responses_create_params`, `_ng_*`): the
    harness's calls are captured under each row's rollout id, a retry's apart from the first
    attempt's, and the collector attaches them."""
    harness = _load(os.path.join(GYM, "responses_api_agents", "mcc_sdk_agent", "agent_harness.py"))
    collector = _load(os.path.join(GYM, "collector.py"))
    sidecar = await start(stand_in.url, capture_dir=capture_dir)
    config = {**_yaml(os.path.join(GYM, "gym_config.yaml")), "mcc_base_url": sidecar.url + "/v1"}

    async def run(row):
        return {**await harness.run_agent(row, config), "reward": 1.0}

    rows = [{"_ng_task_index": 0, "_ng_rollout_index": index, "agent_ref": {"name": "simple_agent"},
             "responses_create_params": {"input": [{"role": "user", "content": f"hello {index}"}]}} for index in range(2)]
    rows.append({**rows[1], "_ng_attempt_index": "1"})
    records = await collector.collect(rows, run, [capture_dir])
    assert [r["ng_model_call_capture"]["rollout_id"] for r in records] == ["0-0", "0-1", "0-1-a1"]
    assert [r["ng_model_call_capture"]["metrics"]["num_calls"] for r in records] == [1, 1, 1]
    assert all(r["response"]["status"] == "completed" and "gaps" not in r["ng_model_call_capture"] for r in records)
    assert CaptureStore(capture_dir).rollout_ids() == ["0-0", "0-1", "0-1-a1"]
    # Issue 33, point 6: the agent reports its invocation, whose id its calls carry (x-session-id,
    # the line's client_session_id): Gym joins them into the row's ng_trajectory.
    for record in records:
        (invocation,) = record["ng_agent_observations"]["records"]
        (line,) = CaptureStore(capture_dir).read(record["ng_model_call_capture"]["rollout_id"])
        assert line["client_session_id"] == invocation["invocation_id"]
        assert invocation["kind"] == "agent_invocation" and invocation["status"] == "completed"
        assert invocation["conversation"][0]["role"] == "user"
        assert invocation["conversation"][1:] == record["response"]["output"], "the reply's items, reasoning first"


def test_gym_deployment_says_one_agent_the_rl_settings_and_gyms_python():
    """Issue 33, point 6: one agent name in the config and the README; the RL settings shown in
    gym_config.yaml are ones the sidecar takes; Gym's real Python floor; a run leaves nothing
    untracked where it runs."""
    readme = open(os.path.join(GYM, "README.md"), encoding="utf-8").read()
    agent_config = open(os.path.join(GYM, "responses_api_agents", "mcc_sdk_agent", "configs", "mcc_sdk_agent.yaml"),
                        encoding="utf-8").read()
    named = set(re.findall(r"--agent (\S+)", readme + agent_config)) | set(re.findall(r"agent_name=(\S+)", readme))
    assert named == {"mcc_sdk_agent"} and "mcc_sdk_agent" in yaml.safe_load(agent_config)
    config_text = open(os.path.join(GYM, "gym_config.yaml"), encoding="utf-8").read()
    shown = [line.strip("# ").strip() for line in config_text.splitlines() if re.match(r"\s*# (capture-tokens|capture-raw-stream):", line)]
    assert len(shown) == 2
    document = yaml.safe_load(config_text)
    document["mcc"].update(yaml.safe_load("\n".join(shown)))
    settings = load_settings({"config": _written(document)}, environ={})
    assert settings.capture_tokens and settings.capture_raw_stream == "on-failure"
    assert ">= 3.13.14" in readme and "--ignore-requires-python" in readme
    ignored = open(os.path.join(GYM, ".gitignore"), encoding="utf-8").read().split()
    assert {"outputs/", "rollouts*.jsonl"} <= set(ignored)


def _written(document) -> str:
    import tempfile
    handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    with handle:
        yaml.safe_dump(document, handle)
    return handle.name


def test_the_gym_harness_sends_only_what_the_task_set():
    """Issue 23: given the row as a Gym agent server dumps it (every unset parameter an explicit
    None), the harness sends the task's parameters and the policy model, no null."""
    harness = _load(os.path.join(GYM, "responses_api_agents", "mcc_sdk_agent", "agent_harness.py"))
    dumped = {"input": [{"role": "user", "content": "hi"}], "model": None, "temperature": None, "tools": None,
              "max_output_tokens": 64, "metadata": None, "store": None}
    params = harness.request_params({"responses_create_params": dumped}, {"policy_model_name": "policy"})
    assert params == {"input": [{"role": "user", "content": "hi"}], "max_output_tokens": 64, "model": "policy"}
    chosen = harness.request_params({"responses_create_params": {**dumped, "model": "mine"}}, {"policy_model_name": "policy"})
    assert chosen["model"] == "mine"


# -- Docker image -----------------------------------------------------------------------------

def _dockerfile() -> list[tuple[str, str]]:
    with open(os.path.join(ROOT, "Dockerfile"), encoding="utf-8") as handle:
        text = re.sub(r"\\\n\s*", " ", handle.read())
    return [tuple(line.split(None, 1)) for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _docker_env() -> dict[str, str]:
    env = {}
    for instruction, arguments in _dockerfile():
        if instruction == "ENV":
            env.update(part.split("=", 1) for part in shlex.split(arguments))
    return env


def test_dockerfile_has_what_a_production_image_needs():
    instructions = _dockerfile()
    names = [name for name, _ in instructions]
    final_stage = instructions[max(i for i, (name, _) in enumerate(instructions) if name == "FROM"):]
    assert all("slim" in args for name, args in instructions if name == "FROM")
    assert ("USER", "10001:10001") in final_stage and ("EXPOSE", "8080") in final_stage, "numeric: runAsNonRoot checks it"
    assert any(name == "HEALTHCHECK" and "/-/healthy" in args for name, args in final_stage)
    assert ("VOLUME", '["/data/model-calls"]') in final_stage
    assert ("ENTRYPOINT", '["mcc", "serve"]') in final_stage
    assert not any(name == "RUN" and ("pytest" in args or "[test" in args) for name, args in final_stage)
    assert names.count("FROM") == 2
    build_stage = instructions[:max(i for i, (name, _) in enumerate(instructions) if name == "FROM")]
    assert any(name == "RUN" and "gcc" in args for name, args in build_stage), "the wheel is built with the compiled core"
    assert not any(name == "RUN" and "gcc" in args for name, args in final_stage)
    assert _docker_env()["MCC_HOST"] == "0.0.0.0"
    with open(os.path.join(ROOT, ".dockerignore"), encoding="utf-8") as handle:
        assert {".git", ".venv", "tests"} <= set(handle.read().split())


@pytest.mark.slow
def test_wheel_entrypoint_runs_in_a_clean_venv_with_the_dockerfile_environment(tmp_path):
    """Build the wheel, install it alone in a fresh venv, run `mcc serve` with the image's ENV."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "-w", str(tmp_path / "dist"), ROOT], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").iterdir()
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    subprocess.run([str(tmp_path / "venv" / "bin" / "pip"), "install", "--quiet", str(wheel)], check=True,
                   capture_output=True)
    env = {**_docker_env(), "PATH": f"{tmp_path / 'venv' / 'bin'}:/usr/bin:/bin",
           "MCC_PORT": "0", "MCC_CAPTURE_DIR": str(tmp_path / "captures"), "MCC_STAND_IN": "true"}
    entrypoint = ["mcc", "serve"]
    process = subprocess.Popen(entrypoint, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = read_line(process.stdout)
        assert line.startswith("listening on http://0.0.0.0:"), line + process.stderr.read()  # type: ignore[union-attr]
        port = line.rsplit(":", 1)[1].strip()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/ng-rollout/img-1/v1/chat/completions", method="POST",
                                         data=b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
        with urllib.request.urlopen(request, timeout=30) as reply:
            reply.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/healthy", timeout=30) as reply:
            assert reply.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=30) as reply:
            core = json.loads(reply.read())["per_event_core"]
        assert core == "compiled" or not has_c_compiler(), f"the wheel carries the compiled core: {core}"
        assert CaptureStore(str(tmp_path / "captures")).read("img-1")[0]["status_code"] == 200
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0


def test_deploy_files_keep_what_their_comments_promise():
    """Issue 21, point 7: vLLM pinned in compose too, with shared memory and a model cache; no
    service-account token where nothing needs the API; a NetworkPolicy example for the port that
    serves /-/metrics; the image's dependencies pinned through a constraints file."""
    compose = _yaml(os.path.join(COMPOSE, "compose.yaml"))
    vllm = compose["services"]["vllm"]
    assert not vllm["image"].endswith(":latest") and ":" in vllm["image"]
    assert vllm.get("ipc") == "host" or "shm_size" in vllm
    assert any(volume.startswith("model-cache:") for volume in vllm["volumes"]) and "model-cache" in compose["volumes"]
    manifests = _manifests()
    assert manifests["deployment.yaml"]["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert _collector_pod()["automountServiceAccountToken"] is False
    policy = manifests["networkpolicy.yaml"]
    assert policy["kind"] == "NetworkPolicy" and policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8080}]
    runs = [args for name, args in _dockerfile() if name == "RUN" and "pip " in args]
    assert all("--constraint" in args or "--no-index" in args for args in runs) and any("==" in args for args in runs)
    with open(os.path.join(ROOT, "deploy", "docker", "constraints.txt"), encoding="utf-8") as handle:
        pinned = {line.split("==")[0] for line in handle.read().splitlines() if line and not line.startswith("#")}
    from importlib.metadata import requires
    dependencies = [r for r in requires("model-call-capture") or () if "extra ==" not in r or '"fast"' in r]
    assert {re.split(r"[<>=;\[ ]", dependency)[0].lower() for dependency in dependencies} <= pinned


def test_the_docs_never_install_us_by_a_name_nobody_owns():
    """Issue 33, point 1: `model-call-capture` is not on the package index; an install line by name
    would fail, or install whatever someone registered under it (dependency confusion). Every
    install of it in the docs and messages goes through the checkout, a path or a wheel."""
    import pathlib
    root = pathlib.Path(CHECKOUT)
    offenders = []
    for path in [*root.glob("*.md"), *root.glob("docs/*.md"), *root.glob("deploy/**/*.md"), *root.glob("proxy/**/*.py"), *root.glob("records/**/*.py"),
                 *root.glob("capture/**/*.py")]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "pip install" in line and "model-call-capture" in line and " @ " not in line and "file://" not in line:
                offenders.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_the_manifests_pin_the_proven_vllm_and_the_batch_the_sidecar_is_sized_for():
    """Issue 33, points 2 and 7: the vLLM image is the release `make vllm-conformance` proves the
    token capture mode's cut on, and vLLM's batch is pinned at the 256 sequences the sidecar's
    memory limit holds (vLLM's own default is 1,024 on H100-class GPUs)."""
    import pathlib
    from tests.vllm_conformance.vllm_server import VLLM_REQUIREMENT
    proven = VLLM_REQUIREMENT.split("==")[1]
    root = pathlib.Path(CHECKOUT)
    for manifest in ("deploy/kubernetes/deployment.yaml", "deploy/compose/compose.yaml"):
        text = (root / manifest).read_text(encoding="utf-8")
        assert f"vllm/vllm-openai:v{proven}" in text, manifest
        assert "--max-num-seqs=256" in text or '"--max-num-seqs", "256"' in text, manifest


async def test_metrics_show_the_resident_memory_to_alert_on(http, upstream, sidecar):
    from tests.wire import fetch
    text = (await fetch(http, "GET", sidecar.url + "/-/metrics")).body.decode()
    assert "process_resident_memory_bytes" in text


def test_the_object_store_variants_send_segments_to_a_store_with_credentials_from_a_secret():
    """Kubernetes (an overlay of deploy/kubernetes) and compose (an override of compose.yaml): the
    sidecar's capture dir is a spool of its own, the store URL is set, credentials come from a
    secret or an env file (never inline), and the collector reads the same store."""
    compose = _yaml(os.path.join(COMPOSE, "compose.yaml"))["services"]["mcc"]
    override = _yaml(os.path.join(COMPOSE, "compose.store.yaml"))["services"]["mcc"]
    environment = {**compose["environment"], **override["environment"]}
    settings = load_settings(environ={k: str(v) for k, v in environment.items()})
    assert settings.capture_store == "s3://your-bucket/model-calls" and settings.capture_on
    assert override["env_file"] == [{"path": "store-credentials.env", "required": False}]
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on the PATH: `kubectl kustomize` cannot render deploy/kubernetes-object-store here")
    rendered = subprocess.run([kubectl, "kustomize", os.path.join(ROOT, "deploy", "kubernetes-object-store")],
                              capture_output=True, text=True, check=True).stdout
    documents = [document for document in yaml.safe_load_all(rendered) if document]
    for document in documents:
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)
    assert "PersistentVolumeClaim" not in {document["kind"] for document in documents}
    deployment = next(d for d in documents if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    sidecar = next(c for c in deployment["containers"] if c["name"] == "model-call-capture")
    env = {item["name"]: item.get("value") for item in sidecar["env"]}
    assert len(env) == len(sidecar["env"])  # Merged by name, never twice.
    settings = load_settings(environ={name: value for name, value in env.items() if name.startswith("MCC_")})
    assert settings.capture_store == "s3://your-bucket/model-calls"
    assert sidecar["envFrom"] == [{"secretRef": {"name": "model-call-store", "optional": True}}]
    assert next(v for v in deployment["volumes"] if v["name"] == "model-calls") == {"name": "model-calls",
                                                                                    "emptyDir": {"sizeLimit": "20Gi"}}
    collector = next(d for d in documents if d["kind"] == "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert collector["containers"][0]["command"][-1] == settings.capture_store
    assert "SECRET_ACCESS_KEY" not in rendered.replace("AWS_SECRET_ACCESS_KEY=...", "")


def test_a_scrape_of_the_sidecars_metrics_ships_both_ways():
    """Issue 73, point 7: the pod template's prometheus.io annotations and an Operator PodMonitor
    (outside the kustomization: its CRD is not on every cluster) both name the sidecar's port and
    /-/metrics, and the PodMonitor selects the pod."""
    deployment = _manifests()["deployment.yaml"]
    template = deployment["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    sidecar = next(container for container in template["spec"]["containers"]
                   if any(env["name"] == "MCC_CAPTURE_DIR" for env in container.get("env", ())))
    (port,) = [port for port in sidecar["ports"] if port["name"] == "http"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": str(port["containerPort"]),
                           "prometheus.io/path": "/-/metrics"}
    monitor = _yaml(os.path.join(KUBERNETES, "monitoring", "podmonitor.yaml"))
    assert monitor["kind"] == "PodMonitor" and monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "http", "path": "/-/metrics", "interval": "15s"}]
