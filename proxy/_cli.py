"""The ``mcc`` command line: ``serve`` and ``demo``."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

import click

from records import RecordsError

from .app import CAPTURE_UMASKS, ConfigError, Settings, configure_logging, load_settings


class _Mcc(click.Group):
    """The ``mcc`` group: every error is one line starting ``mcc:`` (never click's ``Error:``,
    never a traceback for a file that cannot be read), with its exit status (2 for usage)."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # A bare `mcc`: the help itself, as click shows it.
                click.echo(exc.format_message(), err=True)
                sys.exit(exc.exit_code)
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            _fail(exc.format_message() + hint, exc.exit_code)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            _fail("stopped", 1)
        except (OSError, RecordsError) as exc:  # An unreadable file or directory: said, not a traceback.
            _fail(str(exc), 1)
        sys.exit(result if isinstance(result, int) else 0)


def _fail(message: str, status: int) -> None:
    click.echo(f"mcc: {message}", err=True)
    sys.exit(status)


@click.group(cls=_Mcc, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="model-call-capture", prog_name="mcc")
def main() -> None:
    """model-call-capture: a reverse-proxy sidecar that records every model call of a rollout."""


def _no_secret_flag(value: Any) -> None:
    """``--admin-token TOKEN`` is refused: a secret on the command line shows in ``ps``."""
    if value is not None:
        raise click.BadParameter("a token on the command line shows in ps (for the supervisor and every worker): "
                                 "set MCC_ADMIN_TOKEN, or put it in a file and pass --admin-token-file FILE",
                                 param_hint="--admin-token")


#: `mcc serve --help` and docs/configuration.md show the options in these groups, in this order
#: (the names are the settings'; `config` is the file's own option). Every shown option is in one.
SERVE_OPTION_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Forward and listen", ("upstream", "stand_in", "host", "port", "workers", "forward", "admin_token_file",
                            "open_admin", "config")),
    ("Capture", ("capture_dir", "capture_enabled", "model_name", "capture_raw_stream", "capture_sync",
                 "capture_permissions")),
    ("Storage past one node", ("capture_store", "segment_max_bytes", "segment_max_age")),
    ("Training token ids", ("capture_tokens", "token_dir", "supply_prefix", "capture_routed_experts", "engine",
                            "policy_model")),
    ("Privacy", ("redact", "redact_hook", "redact_hook_budget", "redact_hook_workers", "privacy",
                 "privacy_keep_token_ids")),
    ("The upstream connection", ("upstream_ca", "connect_timeout", "read_timeout", "upstream_idle_timeout",
                                 "trace_context", "affinity_header")),
    ("Client connections", ("max_body_bytes", "head_timeout", "max_connections")),
    ("Shutdown", ("drain_timeout", "shutdown_delay")),
    ("Logs", ("log_level", "log_format")),
)

_SERVE_EPILOG = """\b
Agents call http://HOST:PORT/ng-rollout/<rollout_id>/v1/... (the Anthropic SDK: without /v1);
each call is appended to <capture-dir>/<rollout_id>.capture.jsonl.

\b
Examples:
  mcc serve --stand-in --capture-dir "$PWD/captures"          # try it without a GPU
  mcc serve --upstream http://127.0.0.1:8000 --capture-dir /data/model-calls
  mcc serve --upstream http://127.0.0.1:8000 --capture-dir /data/model-calls \\
            --capture-tokens --capture-raw-stream on-failure  # RL: training token ids

\b
Every setting is also an MCC_* variable and a YAML key (under mcc:); the reference:
docs/configuration.md in the repository."""


class _ServeCommand(click.Command):
    """`serve`: its options shown in groups (`SERVE_OPTION_GROUPS`), and typo suggestions that
    leave out the options the supervisor sets for its workers."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = {param.name: param.get_help_record(ctx) for param in self.get_params(ctx)}
        for title, names in SERVE_OPTION_GROUPS:
            with formatter.section(title):
                formatter.write_dl([row for name in names if (row := rows.get(name))])
        grouped = {name for _, names in SERVE_OPTION_GROUPS for name in names}
        rest = [row for name, row in rows.items() if row and name not in grouped]
        if rest:  # --help itself
            with formatter.section("Other"):
                formatter.write_dl(rest)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            hidden = {name for param in self.params if getattr(param, "hidden", False) for name in param.opts}
            shown = [name for name in exc.possibilities or () if name not in hidden]
            raise click.NoSuchOption(exc.option_name, possibilities=shown, ctx=ctx) from None


@main.command(cls=_ServeCommand, epilog=_SERVE_EPILOG)
@click.option("--upstream", metavar="URL", help="Model server to forward to, e.g. http://127.0.0.1:8000. [MCC_UPSTREAM]")
@click.option("--host", help="Address to bind (default 127.0.0.1; 0.0.0.0 in a container). [MCC_HOST]")
@click.option("--port", type=int, help="Port to bind (default 8080; 0 picks a free port). [MCC_PORT]")
@click.option("--capture-dir", metavar="DIR", help="Absolute directory for <rollout_id>.capture.jsonl; capture is off without it. [MCC_CAPTURE_DIR]")
@click.option("--capture/--no-capture", "capture_enabled", default=None, help="Turn capture on or off (NeMo Gym's observability_enabled). [MCC_CAPTURE_ENABLED]")
@click.option("--model-name", metavar="NAME", help="model_ref.name of every record (default: the upstream's host:port). [MCC_MODEL_NAME]")
@click.option("--config", "config", metavar="FILE", help="YAML config; a NeMo Gym global config works. [MCC_CONFIG]")
@click.option("--max-body-bytes", type=int, help="Largest request body accepted (default 256 MiB). [MCC_MAX_BODY_BYTES]")
@click.option("--connect-timeout", type=float, help="Seconds to connect to the upstream (default 10). [MCC_CONNECT_TIMEOUT]")
@click.option("--read-timeout", type=float, help="Seconds allowed between upstream reads (default 600). [MCC_READ_TIMEOUT]")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
              help="Default info. [MCC_LOG_LEVEL]")
@click.option("--log-format", type=click.Choice(["text", "json"], case_sensitive=False), help="Default text. [MCC_LOG_FORMAT]")
@click.option("--drain-timeout", type=float, help="Seconds in-flight calls may finish after SIGTERM (default 25). [MCC_DRAIN_TIMEOUT]")
@click.option("--shutdown-delay", type=float, help="Seconds to keep accepting after SIGTERM while /-/ready says 503, before draining (rolling updates; default 0). [MCC_SHUTDOWN_DELAY]")
@click.option("--stand-in", is_flag=True, default=None, help="Serve the built-in stand-in model server as the upstream. [MCC_STAND_IN]")
@click.option("--capture-sync", type=click.Choice(["auto", "fsync"], case_sensitive=False),
              help="auto: fsync, or one syncfs per batch of several files; fsync: file by file (default auto). [MCC_CAPTURE_SYNC]")
@click.option("--forward", type=click.Choice(["all", "model-api"], case_sensitive=False),
              help="What the port forwards: all (every path; default) or model-api (the model API, vLLM's token endpoints and health; anything else 404, said in the log). [MCC_FORWARD]")
@click.option("--capture-permissions", type=click.Choice(["private", "group"], case_sensitive=False),
              help="Who may read what the sidecar writes: private (files 0600, directories 0700; default: lines hold whole prompts and replies) or group (0640 / 0750, e.g. a collector in the pod's fsGroup). [MCC_CAPTURE_PERMISSIONS]")
@click.option("--capture-raw-stream", type=click.Choice(["always", "on-failure"]),
              help="Keep each stream's SSE text as response_raw always (default), or only when reassembly failed or the stream was cut. [MCC_CAPTURE_RAW_STREAM]")
@click.option("--policy-model", metavar="NAME", help="The model being trained: a call of a rollout for another model is a side call, captured whole, marked side_call and never trained on (default: the model of each rollout's first call). [MCC_POLICY_MODEL]")
@click.option("--token-dir", metavar="DIR", help="Where the training-token files (<rollout_id>.tokens.jsonl, Gym's store) go; default: the capture dir. [MCC_TOKEN_DIR]")
@click.option("--capture-tokens/--no-capture-tokens", default=None,
              help="Token capture mode: ask vLLM for every captured call's token ids and logprobs (added to the request, cut from the agent's reply; off by default). [MCC_CAPTURE_TOKENS]")
@click.option("--supply-prefix/--no-supply-prefix", default=None,
              help="Prefix supply: send each chat turn whose parent call is known on the parent's exact token ids (vLLM kv_transfer_params.prompt_token_ids), so no turn drifts; changes what the model samples (on by default with --capture-tokens where the upstream renders: /tokenize; --no-supply-prefix turns it off). [MCC_SUPPLY_PREFIX]")
@click.option("--capture-routed-experts/--no-capture-routed-experts", default=None,
              help="MoE routed experts: store each call's routed_experts (vLLM --enable-return-routed-experts) apart from the lines, as an object named by its sha256 beside the token files, its parent's rows not again (off by default; needs --capture-tokens). [MCC_CAPTURE_ROUTED_EXPERTS]")
@click.option("--engine", type=click.Choice(["auto", "vllm", "sglang"], case_sensitive=False),
              help="The model server the token capture mode asks for token ids: vllm, sglang (its sglext ids, chat), or auto (default: with --capture-tokens, asked of the upstream at start, GET /server_info answers for SGLang; vLLM otherwise). [MCC_ENGINE]")
@click.option("--redact", metavar="FILE", help="Redaction rules (YAML: rules: [{name, pattern}]): every match in what is captured is replaced by [REDACTED:<name>:<tag>] before it is written; a rule that does not compile stops the start (docs/privacy.md). [MCC_REDACT]")
@click.option("--redact-hook", metavar="MODULE:FUNCTION", help="A callable given every captured text value (after the rules), returning it redacted; one that raises or runs past --redact-hook-budget leaves the line in metrics-only form, marked redaction_failed. [MCC_REDACT_HOOK]")
@click.option("--redact-hook-budget", type=float, help="Seconds the redaction hook may take per line, from the moment the line is ready (default 1). [MCC_REDACT_HOOK_BUDGET]")
@click.option("--redact-hook-workers", type=int, help="Lines the redaction hook works on at once, each on a thread of its own (default 16; a hook past its budget keeps its thread until it returns). [MCC_REDACT_HOOK_WORKERS]")
@click.option("--privacy", type=click.Choice(["full", "metrics-only"], case_sensitive=False),
              help="full (default), or metrics-only: lines keep ids, timing, status, usage, finish reasons and tool names; every content value is replaced; no raw text, no token files. [MCC_PRIVACY]")
@click.option("--privacy-keep-token-ids/--no-privacy-keep-token-ids", default=None,
              help="With --privacy metrics-only: keep token ids and logprob numbers (token ids decode to the text). [MCC_PRIVACY_KEEP_TOKEN_IDS]")
@click.option("--trace-context/--no-trace-context", default=None,
              help="Send a W3C traceparent upstream with each captured call that has none (the rollout's trace; the upstream's spans join it; default on). [MCC_TRACE_CONTEXT]")
@click.option("--upstream-ca", metavar="FILE", help="CA bundle (PEM) for an HTTPS upstream with a private or self-signed certificate. [MCC_UPSTREAM_CA]")
@click.option("--affinity-header", metavar="NAME", help="Send each captured call upstream with this header set to its rollout id (unless the agent sent it), for a router that places sessions by a header: x-session-id (vllm-router), x-smg-routing-key (SGLang), X-Dynamo-Session-ID (Dynamo). [MCC_AFFINITY_HEADER]")
@click.option("--admin-token-file", metavar="FILE", help="A file holding the runner's and trainer's token (or set MCC_ADMIN_TOKEN; never a flag: it would show in ps): admin requests that change state (POST /-/rollouts/<id>/end, POST /-/run/end, POST /-/weight-version) need Authorization: Bearer <token>; model calls never do. Without a token they are refused. [MCC_ADMIN_TOKEN_FILE]")
@click.option("--open-admin/--no-open-admin", default=None, help="Let whatever reaches the port end rollouts and declare weight versions with no token: an agent could post its own reward (a trusted single-user setup only; off by default). [MCC_OPEN_ADMIN]")
@click.option("--admin-token", hidden=True, expose_value=False, callback=lambda context, parameter, value: _no_secret_flag(value))
@click.option("--capture-store", metavar="URL", help="Write-once storage past one node: segments:///path, s3://bucket/prefix, gs://..., az://...; the capture dir is then the local spool (off by default). [MCC_CAPTURE_STORE]")
@click.option("--segment-max-bytes", type=int, help="Seal (and upload) a writer segment at this size (default 64 MiB). [MCC_SEGMENT_MAX_BYTES]")
@click.option("--segment-max-age", type=float, help="Seal (and upload) a writer segment this many seconds after it opened (default 60). [MCC_SEGMENT_MAX_AGE]")
@click.option("--upstream-idle-timeout", type=float, help="Seconds a pooled upstream connection may idle and be reused; keep it below the upstream's keep-alive (default 4; uvicorn: 5). [MCC_UPSTREAM_IDLE_TIMEOUT]")
@click.option("--head-timeout", type=float, help="Seconds a client may take to send a request head (default 20). [MCC_HEAD_TIMEOUT]")
@click.option("--max-connections", type=int, help="Client connections open at once (default 16384). [MCC_MAX_CONNECTIONS]")
@click.option("--workers", type=int, help="Processes serving the port with SO_REUSEPORT (default 1). [MCC_WORKERS]")
@click.option("--reuse-port", is_flag=True, default=None, hidden=True, help="Bind with SO_REUSEPORT (set for workers).")
@click.option("--metrics-dir", hidden=True, help="Where workers share their metrics (set for workers).")
@click.option("--worker-index", type=int, hidden=True, help="This worker's slot (set for workers).")
@click.option("--worker-count", type=int, hidden=True, help="How many workers (set for workers).")
def serve(**options: Any) -> None:
    """Run the sidecar in front of a model server, until SIGINT or SIGTERM.

    \b
    Its own endpoints (everything else is forwarded): /-/healthy (or /-/health), /-/ready, /-/metrics.
    """
    warnings: list[str] = []
    settings = _settings_or_exit(options, warnings.append)
    # Before anything is created: every file and directory the sidecar and its children make is
    # at most 0600 / 0700 (or 0640 / 0750), whatever mode the code asks for (docs/operations.md).
    os.umask(CAPTURE_UMASKS[settings.capture_permissions])
    configure_logging(settings.log_level, settings.log_format,
                      (settings.worker_index, settings.worker_count or 1) if settings.worker_index is not None else None)
    for message in warnings:  # Said once (by the supervisor, not every worker), in the chosen format.
        if not settings.reuse_port:
            logging.getLogger("mcc").warning("%s", message)
    if settings.workers > 1:
        from .app import supervise_workers

        sys.exit(supervise_workers(settings, sys.argv[1:]))
    from .app import CannotServe, serve_forever

    stand_in: Any = None
    if settings.stand_in:  # Loaded only when asked for.
        from .standin import start_stand_in

        stand_in = start_stand_in
    try:
        _run(serve_forever(settings, settings.log_format, stand_in))
    except CannotServe as exc:
        click.echo(f"mcc: {exc}.", err=True)
        sys.exit(2)


@main.command()
@click.option("--capture-dir", metavar="DIR", default="demo-captures", show_default=True,
              help="Where the demo's capture files go (made absolute).")
def demo(capture_dir: str) -> None:
    """Start the stand-in model server and the sidecar, drive them with the official SDKs, print the captures."""
    configure_logging("warning")
    from .standin import run_demo

    sys.exit(_run(run_demo(capture_dir)))


@main.command("stand-in")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=int, default=8000, show_default=True, help="Port to bind (0 picks a free one, printed).")
@click.option("--delay", type=float, default=0.0, show_default=True,
              help="Seconds before each reply, as a generation would take (to see calls in flight).")
@click.option("--force-include-usage", is_flag=True,
              help="End every chat and completions stream with its usage chunk, asked for or not (vLLM's "
                   "--enable-force-include-usage).")
def stand_in(host: str, port: int, delay: float, force_include_usage: bool) -> None:
    """Run the built-in stand-in model server alone, until SIGINT or SIGTERM.

    Deterministic replies in every dialect (Responses, Chat Completions, Completions, Anthropic
    Messages; streamed or not; vLLM's token fields on request), no GPU: the model behind
    `mcc serve --upstream http://127.0.0.1:8000` and deploy/gym/gym_config.yaml's policy_model.
    """
    from .standin import serve_stand_in_forever

    try:
        _run(serve_stand_in_forever(host, port, delay, force_include_usage))
    except OSError as exc:
        click.echo(f"mcc: cannot listen on {host}:{port}: {exc.strerror or exc}", err=True)
        sys.exit(2)


def _register_inspection_commands() -> None:
    from .inspection import COMMANDS

    for command in COMMANDS:
        main.add_command(command)


def _settings_or_exit(options: dict[str, Any], warn: Any = None) -> Settings:
    try:
        return load_settings(options, warn=warn)
    except ConfigError as exc:
        click.echo(f"mcc: {exc}", err=True)
        sys.exit(2)


def _run(coroutine: Any) -> Any:
    try:
        import uvloop  # A dependency, but not on Windows: the faster event loop where it is installed.
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


_register_inspection_commands()
