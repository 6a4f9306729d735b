"""The ``mcc`` command line: ``serve`` and ``demo``."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

import click

from records import RecordsError

from .app import CAPTURE_UMASKS, OPTION_GROUPS, OPTIONS, ConfigError, Option, Settings, configure_logging, load_settings


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


#: `mcc serve --help` and docs/configuration.md show the options in these groups, in this order
#: (`proxy.app.OPTION_GROUPS`; the names are the settings', declared by the proxy and its features:
#: `proxy.app.OPTIONS`). ``config`` is the file's own option, last in the first group.
SERVE_OPTION_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (title, tuple(option.name for option in OPTIONS if option.group == title and option.help is not None)
     + (("config",) if title == OPTION_GROUPS[0] else ()))
    for title in OPTION_GROUPS + tuple(dict.fromkeys(o.group for o in OPTIONS if o.group not in OPTION_GROUPS + (None,))))


def _click_option(option: Option) -> Any:
    """``mcc serve``'s flag of a declared option: ``--`` + its name (a bool: ``--x/--no-x``, or ``--x``
    for a switch), its help ending with its variable (``[MCC_X]``)."""
    if option.help is None:  # No flag: a variable or a YAML key only; a secret's flag says how to give it.
        refusal = option.refused_flag
        if refusal is None:
            return None
        return click.option(option.flag, hidden=True, expose_value=False,
                            callback=lambda context, parameter, value: _refused(value, refusal, parameter))
    flag = option.flag
    help_text = option.help if option.internal else f"{option.help} [{option.variable}]"
    extra: dict[str, Any] = {"hidden": option.internal, "help": help_text}
    if option.choices:
        extra["type"] = click.Choice(list(option.choices), case_sensitive=False)
    elif option.switch:
        extra.update(is_flag=True, default=None)
    elif _base_type(option.type) is bool:
        flag = "/".join(option.flags) if option.flags else f"{flag}/--no-{flag[2:]}"
        extra["default"] = None
    elif _base_type(option.type) in (int, float):
        extra["type"] = _base_type(option.type)
    if option.metavar:
        extra["metavar"] = option.metavar
    return click.option(flag, option.name, **extra)


def _base_type(kind: Any) -> Any:
    """``int`` of ``int | None``."""
    arguments = [argument for argument in getattr(kind, "__args__", (kind,)) if argument is not type(None)]
    return arguments[0] if len(arguments) == 1 else kind


def _refused(value: Any, why: str, parameter: click.Parameter) -> None:
    if value is not None:
        raise click.BadParameter(why, param_hint=parameter.opts[0])


def _with_declared_options(command: Any) -> Any:
    """Every declared option's flag on ``command`` (the proxy's first, then each feature's)."""
    for option in reversed(OPTIONS):
        decorator = _click_option(option)
        if decorator is not None:
            command = decorator(command)
    return click.option("--config", "config", metavar="FILE",
                        help="YAML config; a NeMo Gym global config works. [MCC_CONFIG]")(command)


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
@_with_declared_options
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
