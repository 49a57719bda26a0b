"""What every ``corral`` command shares: exit codes, the one-line error,
the group class, the common options, the store a command names, argument
parsing and loading an ``APP``. The command modules import these from here,
and :mod:`corral.cli` re-exports them."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from corral.errors import CorralError
from corral.stores import default_url, open_store

log = logging.getLogger("corral.cli")

# ---- exit codes -----------------------------------------------------------------------
#: A command that failed on bad input or a failing store (one ``error:`` line).
EXIT_ERROR = 1
#: Bad usage: an unknown option, a missing argument, options that go together.
EXIT_USAGE = 2
#: A worker stopped at once by a second signal during its grace period.
EXIT_FORCED = 3  # the same value as corral.engine.foreground.EXIT_FORCED (a test holds them equal)
#: A worker that stopped because too many of its timed-out task threads still ran: restart it.
EXIT_ABANDONED = 4  # the same value as corral.engine.foreground.EXIT_ABANDONED
#: Interrupted by Ctrl-C (outside a worker, which handles it).
EXIT_INTERRUPTED = 130


# ---- errors: one line, no traceback --------------------------------------------------
class CLIError(click.ClickException):
    """A user-facing failure: printed as one line, exit status 1."""


def one_line(text: str) -> str:
    """The first non-blank line of ``text`` (an error message shown on one line)."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0] if lines else "unknown error"


def _debug() -> bool:
    return os.environ.get("CORRAL_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


_NoArgsIsHelp = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2


class CorralGroup(click.Group):
    """A click group whose every failure is one ``error:`` line on stderr."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name or "corral", complete_var, standalone_mode=False, **extra)
        except click.exceptions.Abort:
            _fail("interrupted", EXIT_INTERRUPTED)
        except _NoArgsIsHelp as exc:  # `corral` or `corral bench` alone: show the help
            click.echo(exc.format_message())
            sys.exit(0)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except CorralError as exc:
            _fail(str(exc) or type(exc).__name__, EXIT_ERROR)
        except KeyboardInterrupt:
            _fail("interrupted", EXIT_INTERRUPTED)
        except Exception as exc:  # noqa: BLE001 - the contract is one line, not a traceback
            if _debug():
                raise
            _fail(f"{type(exc).__name__}: {exc}", EXIT_ERROR)
        sys.exit(rv if isinstance(rv, int) else 0)


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {one_line(message)}", err=True)
    sys.exit(code or EXIT_ERROR)


# ---- shared options -------------------------------------------------------------------
def store_option(f: Callable) -> Callable:
    return click.option(
        "--store",
        "store_url",
        metavar="URL",
        default=None,
        help="memory://, sqlite:///path or postgresql://... (default: $CORRAL_STORE, else sqlite:///corral.db)",
    )(f)


def json_option(f: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(f)


def log_level_option(f: Callable) -> Callable:
    return click.option(
        "--log-level",
        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
        default="INFO",
        show_default=True,
    )(f)


# ---- the store a command names --------------------------------------------------------
def given_store(store_url: str | None) -> str | None:
    """The URL given on the command line (``corral --store X cmd`` or ``cmd --store X``), if any."""
    ctx = click.get_current_context(silent=True)
    group_url = ctx.find_root().params.get("store_url") if ctx is not None else None
    return store_url or group_url


def store_url_of(store_url: str | None) -> str:
    """The URL a command uses: the one given, else ``$CORRAL_STORE``, else the default."""
    return given_store(store_url) or default_url()


def open_given_store(store_url: str | None, *, create: bool = True):
    """Open (and migrate) the store a command uses. A command that only reads
    passes ``create=False``: a store that does not exist is a one-line error,
    never a new empty one."""
    store = open_store(store_url_of(store_url), create=create)
    store.migrate()
    return store


# ---- argument parsing ------------------------------------------------------------------
def duration_arg(text: str, what: str, default_unit: str = "s") -> float:
    """Seconds in a duration option (``30s``, ``5m``, ``200ms``); a bare number is in ``default_unit``."""
    from corral.core.planning import parse_duration

    try:
        return parse_duration(text, default_unit)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=what) from None


def json_arg(text: str, what: str, kind: type) -> Any:
    """A JSON argument that must be a ``list`` or a ``dict``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CLIError(f"{what} is not valid JSON ({exc.msg} at char {exc.pos}): {text!r}") from None
    if not isinstance(value, kind):
        want = (
            'a JSON array, e.g. \'["A1", "tmall"]\'' if kind is list else 'a JSON object, e.g. \'{"channel": "tmall"}\''
        )
        raise CLIError(f"{what} must be {want}, not {type(value).__name__}")
    return value


def load_app(spec: str, store_url: str | None = None):
    """Import ``module:attribute`` and return the App it names.

    With ``store_url``, ``$CORRAL_STORE`` is set before the import, so an
    ``App()`` built with no URL opens that store; an app that names its own
    store is moved to ``store_url`` (its declared limits are copied).
    """
    from corral.app import App

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CLIError(f"bad APP {spec!r}: expected module:attribute, e.g. examples.shop:app")
    if store_url:
        os.environ["CORRAL_STORE"] = store_url
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise CLIError(
                f"bad APP {spec!r}: no module named {exc.name!r} "
                "(run from the directory that holds it, or set PYTHONPATH)"
            ) from None
        raise CLIError(f"bad APP {spec!r}: importing {module_name} failed: {exc}") from None
    except CorralError as exc:
        raise CLIError(f"bad APP {spec!r}: {one_line(str(exc))}") from None
    except Exception as exc:  # noqa: BLE001 - any import-time failure is the APP's
        raise CLIError(
            f"bad APP {spec!r}: importing {module_name} failed: {type(exc).__name__}: {one_line(str(exc))}"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CLIError(f"bad APP {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, App):
        raise CLIError(f"bad APP {spec!r}: {attr} is a {type(obj).__name__}, not a corral.App")
    if store_url and getattr(obj.store, "url", store_url) != store_url:
        new = open_store(store_url)
        new.migrate()
        for spec_ in obj.store.limits().values():
            new.set_limit(spec_)
        log.warning("app %s names store %s; using %s as --store asks", spec, obj.store.url, store_url)
        obj.store = new
    return obj
