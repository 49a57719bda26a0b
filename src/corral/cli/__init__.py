"""The ``corral`` command line: it parses arguments and delegates.

One entry point; every command takes ``--store URL`` (default ``$CORRAL_STORE``,
else ``sqlite:///corral.db``) and, on bad input, exits non-zero with a single
``error: ...`` line on stderr and no traceback (set ``CORRAL_DEBUG=1`` to see
the traceback of an unexpected error).

This module holds the group and :func:`main`; the options, argument parsing
and error handling every command shares are in :mod:`corral.cli.common`. The commands live by area:

- :mod:`corral.cli.worker`: ``worker APP`` and ``sweep`` (long-running processes);
- :mod:`corral.cli.tasks`: ``submit``, ``status``, ``tasks``, ``show ID``,
  ``cancel ID``, ``retry ID|--batch B``;
- :mod:`corral.cli.limit`: ``limit [show|set NAME|reset NAME]`` (named limits while running);
- :mod:`corral.cli.prune`: ``prune --older-than AGE`` (old finished tasks);
- :mod:`corral.cli.events`: ``events`` (the event stream, ``--follow``);
- :mod:`corral.cli.batch`: ``batch show B`` (a live progress bar);
- :mod:`corral.cli.workers`: ``workers`` (worker processes, what they hold, dead ones);
- :mod:`corral.cli.why`: ``why ID`` (what holds a queued or held task);
- :mod:`corral.cli.plan`: ``plan`` (the numbers come from :mod:`corral.core.planning`);
- :mod:`corral.cli.demo`: ``demo`` (runs :mod:`corral.edges.demo`) and ``dashboard``;
- ``bench``: the :mod:`corral.bench` package, added when it can be imported.

What they print (tables, times, durations, JSON) is in :mod:`corral.cli.render`.
``APP`` is ``module:attribute`` naming a :class:`corral.App`; the current
directory is importable, like other tools do.
"""

from __future__ import annotations

import click

from corral.cli.common import (
    EXIT_ABANDONED,
    EXIT_ERROR,
    EXIT_FORCED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CLIError,
    CorralGroup,
    duration_arg,
    given_store,
    json_arg,
    json_option,
    load_app,
    log_level_option,
    one_line,
    open_given_store,
    store_option,
    store_url_of,
)


# ---- the group ------------------------------------------------------------------------
@click.group(cls=CorralGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="corral", prog_name="corral")
@store_option
def cli(store_url: str | None) -> None:
    """corral: parallel task management. Who runs, how many run, in what
    order, and what happens when a run dies half-way.

    Try `corral demo`, then `corral status` and `corral tasks`.
    """


def _add_commands() -> None:
    # Imported here, after the group exists.
    from corral.cli import (
        batch,
        controls,
        demo,
        events,
        limit,
        pauses,
        periodic,
        plan,
        prune,
        tasks,
        why,
        worker,
        workers,
    )

    for command in (
        worker.worker,
        workers.workers,
        tasks.submit,
        tasks.status,
        tasks.tasks,
        tasks.show,
        why.why,
        tasks.cancel,
        tasks.retry,
        worker.sweep,
        prune.prune,
        controls.breaker,
        controls.level,
        limit.limit,
        controls.dead,
        pauses.pause,
        pauses.resume,
        events.events,
        periodic.periodic,
        demo.dashboard,
        demo.demo,
        plan.plan,
        batch.batch,
    ):
        cli.add_command(command)
    _add_bench()


def _add_bench() -> None:
    """``corral bench`` is its own package, optional: without it the command says so."""
    try:
        from corral.bench import bench as bench_command
    except ImportError as exc:
        reason = one_line(str(exc))

        @cli.command(name="bench", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
        @click.argument("scenario", required=False)
        @store_option
        def bench_missing(scenario, store_url):
            """Benchmarks (not available in this installation)."""
            raise CLIError(f"benchmarks are not available in this installation ({reason})")

        return
    cli.add_command(bench_command, name="bench")


_add_commands()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="corral")


__all__ = [
    "cli",
    "main",
    "CLIError",
    "CorralGroup",
    "load_app",
    "EXIT_ERROR",
    "EXIT_USAGE",
    "EXIT_FORCED",
    "EXIT_ABANDONED",
    "EXIT_INTERRUPTED",
    "duration_arg",
    "given_store",
    "json_arg",
    "json_option",
    "log_level_option",
    "one_line",
    "open_given_store",
    "store_option",
    "store_url_of",
]
