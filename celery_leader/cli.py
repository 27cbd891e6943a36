"""``celery -A proj leader status|resign``: see and steer the elections.

Registered through the ``celery.commands`` entry point, so it is a
subcommand of Celery's own click CLI and gets ``-A`` and the app's settings.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .backends import Backend, HolderInfo, create_backend
from .config import LeaderConfig, validate_name
from .exceptions import ConfigError, StoreUnavailable, missing_extra

try:
    import click
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None


def _setup(ctx: click.Context) -> tuple[LeaderConfig, Backend]:
    app = ctx.obj.app
    try:
        config = LeaderConfig.from_app(app)
        return config, create_backend(config)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc


def _row(election: str, info: HolderInfo | None) -> dict[str, Any]:
    return {
        "election": election,
        "holder": None if info is None else info.instance_id,
        "epoch": None if info is None else info.epoch,
        "ttl_remaining": None if info is None else info.ttl_remaining,
    }


@click.group(name="leader")
def leader() -> None:
    """Leader elections of celery-leader: who leads, and hand-over."""


@leader.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Print holder, epoch and time left on the lease of every election."""
    config, backend = _setup(ctx)
    try:
        names = sorted(set(backend.elections()) | {config.beat_election, config.worker_election})
        rows = [_row(name, backend.holder(name)) for name in names]
    except StoreUnavailable as exc:
        raise click.ClickException(f"store {config.display_url} unreachable: {exc}") from exc
    finally:
        backend.close()
    if as_json:
        click.echo(json.dumps({"store": config.display_url, "elections": rows}, indent=2))
        return
    click.echo(f"store: {config.display_url}")
    click.echo(f"{'ELECTION':<20} {'HOLDER':<32} {'EPOCH':>6} {'TTL LEFT':>9}")
    for row in rows:
        ttl = row["ttl_remaining"]
        left = "-" if ttl is None else f"{ttl:.1f}s"
        if row["holder"] is not None and ttl is None:
            left = "held"  # a store that frees the lock only when the holder ends
        click.echo(
            f"{row['election']:<20} {row['holder'] or '(nobody)':<32} "
            f"{row['epoch'] if row['epoch'] is not None else '-':>6} {left:>9}"
        )


@leader.command()
@click.argument("election", required=False)
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait for the next holder.")
@click.pass_context
def resign(ctx: click.Context, election: str | None, wait: bool) -> None:
    """Ask the holder of ELECTION (default: the beat election) to hand over.

    The holder steps down at its next renewal and sits out one renew
    interval, so another instance takes over.
    """
    config, backend = _setup(ctx)
    name = election or config.beat_election
    try:
        validate_name("election", name)
        info = backend.request_resign(name)
        if info is None:
            raise click.ClickException(f"nobody leads {name!r}; nothing to resign")
        click.echo(f"asked {info.instance_id} (epoch {info.epoch}) to hand over {name!r}")
        if not wait:
            return
        # The holder acts at its next renewal; a follower then needs up to one
        # more renew interval (plus the ttl if a release goes unannounced).
        patience = 2 * config.renew_interval + config.ttl
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            now = backend.holder(name)
            if now is not None and now.epoch > info.epoch:
                click.echo(f"{now.instance_id} leads {name!r} now (epoch {now.epoch})")
                return
            time.sleep(0.05)
        raise click.ClickException(f"no new holder of {name!r} within {patience:g} s")
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    except StoreUnavailable as exc:
        raise click.ClickException(f"store {config.display_url} unreachable: {exc}") from exc
    finally:
        backend.close()
