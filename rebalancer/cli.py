"""The ``rebalancer`` command line: a thin layer over the engine's entry points.

Each command parses its options, opens the workspace (settings, warehouse and, when it needs one, the Spark
session: :class:`rebalancer.workspace.Workspace`), calls one engine function and prints what it returns through
:mod:`rebalancer.console`. The functions live with what they do: :mod:`rebalancer.operations` holds the small
warehouse operations that have no module of their own (``generate``, ``event``, ``vacuum``, ``export-affinity``
and ``route``); the other commands call their own module: ``exchange``
:func:`rebalancer.pipeline.run_exchange`, ``what-if`` :mod:`rebalancer.what_if`, ``explain``
:mod:`rebalancer.explain`, ``simulate`` :mod:`rebalancer.twin.simulate`, ``report`` :mod:`rebalancer.report`,
``balance`` :mod:`rebalancer.balance`, ``demo`` :mod:`rebalancer.demo`, the ``kafka`` and ``ignite`` commands
:mod:`rebalancer.kafka.drive` and :mod:`rebalancer.ignite.collect`, ``init`` :mod:`rebalancer.formats` and
``upgrade`` :mod:`rebalancer.upgrade`; ``sql`` runs a query over the warehouse's tables as Spark views.

Errors print one sentence (``error: ...``; for an error raised in the JVM, its innermost Java cause) and exit 1;
``--verbose`` prints the full traceback before it, ``REBALANCER_DEBUG=1`` re-raises.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from rebalancer import tables
from rebalancer.config import load_settings
from rebalancer.console import (
    RowFormat,
    console,
    err_console,
    print_collect,
    print_execute,
    print_ignite_collect,
    print_kafka_round,
    print_round,
    print_rows,
    print_stability,
    print_summary,
    print_what_if,
    step,
)
from rebalancer.workspace import Workspace

app = typer.Typer(
    name="rebalancer",
    help=(
        "Partition map exchange, late affinity and migration plans as batch Spark jobs over Delta tables.\n\n"
        "New here? `rebalancer demo` runs the whole story on a local warehouse; then `generate`, `event`, "
        "`exchange`, `simulate` and `report` step through it yourself, and `sql` queries any table "
        "(ready queries: docs/QUERIES.md)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _state(ctx: typer.Context) -> Workspace:
    state: Workspace = ctx.obj
    return state


@app.callback()
def _global_options(
    ctx: typer.Context,
    warehouse: Annotated[
        str | None, typer.Option("--warehouse", help="Warehouse directory (default: storage.warehouse, 'warehouse').")
    ] = None,
    conf: Annotated[
        Path | None, typer.Option("--conf", help="TOML settings file; see conf/default.toml for every key.")
    ] = None,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Fail the run on any bad input row, naming the problem, instead of recording it in rejected_rows "
            "and going on (sets validation.strict = true).",
        ),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", help="Log the engine's stages and Spark task progress to stderr; on an "
                           "error, print the whole traceback before its one sentence.")
    ] = False,
) -> None:
    _ERRORS.verbose = verbose
    _log_to_stderr(verbose)
    settings = load_settings(conf)
    if warehouse is not None:
        settings = settings.with_overrides(storage={"warehouse": warehouse})
    if strict:
        settings = settings.with_overrides(validation={"strict": True})
    ctx.obj = Workspace(settings, starting=_starting, announce=lambda text: err_console.print(f"[dim]{text}[/dim]"))
    ctx.call_on_close(ctx.obj.close)  # after the command, failed or not


@app.command()
def init(ctx: typer.Context) -> None:
    """Create a warehouse, or the tables of the contract a current one misses (idempotent)."""
    from rebalancer.formats import create_warehouse

    state = _state(ctx)
    with step("creating tables"):
        created = create_warehouse(state.any_warehouse())
    where = state.warehouse.location
    if created:
        console.print(f"created {len(created)} tables in {where}: {', '.join(created)}")
    else:
        console.print(f"all tables already exist in {where}")


@app.command()
def generate(
    ctx: typer.Context,
    nodes: Annotated[int, typer.Option(help="Server nodes.")] = 5,
    groups: Annotated[int, typer.Option(help="Cache groups.")] = 2,
    partitions: Annotated[int, typer.Option(help="Partitions per group (1..65536).")] = 1024,
    backups: Annotated[int, typer.Option(help="Backups per partition.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed: the same seed gives the same cluster.")] = 0,
    affinity: Annotated[str, typer.Option(help="Every group's affinity: rendezvous, ignite or balanced.")] = (
        "rendezvous"
    ),
) -> None:
    """Replace the warehouse's inputs with a steady synthetic cluster (every ideal replica OWNING)."""
    from rebalancer.operations import generate_into
    from rebalancer.vocabulary import AFFINITIES

    if affinity not in AFFINITIES:  # before starting Spark
        raise typer.BadParameter(f"must be one of {', '.join(AFFINITIES)}, got {affinity!r}", param_hint="--affinity")
    state = _state(ctx)
    with step(f"generating {nodes} nodes, {groups} groups x {partitions} partitions, {backups} backups"):
        warehouse = state.new_or_current_warehouse()
        counts = generate_into(
            state.spark, warehouse, state.settings, nodes, groups, partitions, backups, seed, affinity
        )
    console.print(
        f"wrote {counts['nodes']} nodes, {counts['cache_groups']} cache groups, "
        f"{counts['topology_events']} events and {counts['partition_reports']} partition reports "
        f"to {state.warehouse.location}"
    )


@app.command()
def event(
    ctx: typer.Context,
    event_type: Annotated[
        str, typer.Argument(metavar="TYPE", help="NODE_JOINED, NODE_LEFT, NODE_FAILED, NODE_DRAINING (with --node); "
                            "CACHE_STARTED, CACHE_STOPPED, RESET_LOST_PARTITIONS (with --group); BASELINE_CHANGED, "
                            "CLUSTER_ACTIVATED, CLUSTER_DEACTIVATED.")
    ],
    node: Annotated[str | None, typer.Option("--node", help="Node id (node events).")] = None,
    group: Annotated[str | None, typer.Option("--group", help="Cache group (cache and reset events).")] = None,
    host: Annotated[str | None, typer.Option(help="Host of a new node (NODE_JOINED).")] = None,
    zone: Annotated[str | None, typer.Option(help="Zone attribute of a new node (NODE_JOINED).")] = None,
    client: Annotated[bool, typer.Option("--client", help="The new node is a client (holds no data).")] = False,
) -> None:
    """Append a topology event; the next `exchange` processes it."""
    from rebalancer.operations import append_event, check_event

    check_event(event_type, node, group)  # before starting Spark: a typo costs no JVM start
    state = _state(ctx)
    appended = append_event(
        state.spark, state.warehouse, event_type, node, group, host=host, zone=zone, is_client=client
    )
    subject = appended.node_id or appended.group_name  # cluster events (baseline, activation) name neither
    console.print(f"event {appended.event_seq}: {appended.event_type}" + (f" {subject}" if subject else ""))
    if appended.node_added:
        console.print(f"node {appended.node_id} added to nodes")


@app.command()
def sql(
    ctx: typer.Context,
    query: Annotated[str, typer.Argument(help="Spark SQL; every table is a view by its name.")],
    limit: Annotated[int, typer.Option(help="Rows to print at most.")] = 100,
    row_format: Annotated[RowFormat, typer.Option(
        "--format", help="table (plain and never cut when stdout is not a terminal), csv with a header row, or json "
        "(one object per line); for csv and json the row count goes to stderr.")] = RowFormat.TABLE,
) -> None:
    """Run a Spark SQL query over the warehouse tables and print the result."""
    state = _state(ctx)
    named = tables.named_in(query)  # a view per table the query names: each costs a read of the table's log
    state.warehouse.register_views(None if named is None else [n for n in named if state.warehouse.exists(n)])
    df = state.spark.sql(query)
    print_rows(df.columns, [tuple(r) for r in df.limit(limit + 1).collect()], limit, row_format)


@app.command()
def exchange(ctx: typer.Context) -> None:
    """Process every pending event and the latest partition reports; commit the resulting topology versions."""
    from rebalancer.pipeline import run_exchange

    state = _state(ctx)
    with step("running the exchange"):
        summaries = run_exchange(state.spark, state.warehouse, state.settings)
    if not summaries:
        console.print("nothing to do: no pending event and no late affinity switch due")
    for s in summaries:
        print_summary(s)


@app.command("what-if")
def what_if_command(
    ctx: typer.Context,
    scenario: Annotated[
        list[str] | None,
        typer.Option("--scenario", metavar="EVENTS", help="Events to try together, e.g. \"NODE_FAILED node3; "
                     "NODE_FAILED node7\" (node events name a node, cache events a group). Repeatable."),
    ] = None,
    sweep: Annotated[
        list[str] | None,
        typer.Option("--sweep", metavar="KIND", help="nodes (each server fails alone), hosts (each host fails), or a "
                     "node attribute such as zone (each of its values fails). Repeatable. Default, with no "
                     "--scenario: nodes."),
    ] = None,
    top: Annotated[int, typer.Option(help="Scenarios to print, worst first (all go to the what_if table).")] = 20,
) -> None:
    """Evaluate hypothetical events against the latest committed version in one Spark pass; commit nothing.

    Per scenario: lost partitions, partitions left without a backup, copies and bytes to move, the plan's makespan
    and bound, and replicas per node; written to the what_if table and printed worst first.
    """
    from rebalancer.what_if import parse_scenario, what_if

    scenarios = [parse_scenario(text) for text in scenario or []]  # before starting Spark: a typo costs no JVM
    state = _state(ctx)
    with step("evaluating scenarios"):
        run = what_if(state.spark, state.warehouse, state.settings, scenarios, sweep or [])
    print_what_if(run, top)


@app.command("explain")
def explain_command(
    ctx: typer.Context,
    group: Annotated[str, typer.Option("--group", help="Cache group.")],
    partition: Annotated[int, typer.Option("--partition", help="Partition id.")],
    version: Annotated[
        str | None, typer.Option("--version", metavar="MAJOR.MINOR", help="A committed version (default: latest).")
    ] = None,
    node: Annotated[str | None, typer.Option("--node", help="Only what involves this node.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
) -> None:
    """Why a partition is where it is: ranked candidates, each copy's state, who serves, the plan and its schedule."""
    import json

    from rebalancer.explain import describe, explain

    wanted = None
    if version is not None:
        try:
            major, minor = (int(x) for x in version.split("."))
        except ValueError:
            raise typer.BadParameter(f"expected MAJOR.MINOR such as 6.0, got {version!r}",
                                     param_hint="--version") from None
        wanted = (major, minor)
    state = _state(ctx)
    answer = explain(state.warehouse, state.settings, group, partition, wanted, node)
    if as_json:
        console.print_json(json.dumps(answer, default=str))
    else:
        for line in describe(answer):
            console.print(line, markup=False)


@app.command()
def vacuum(
    ctx: typer.Context,
    keep_versions: Annotated[int, typer.Option("--keep-versions", metavar="N",
                                               help="Committed versions whose rows stay (the newest N; at least 1).")],
    retain_hours: Annotated[int, typer.Option("--retain-hours", metavar="H", help=(
        "Delta VACUUM retention: data files a table version of the last H hours references stay (time travel, "
        "concurrent readers). 0 frees the space at once; only when nothing else uses the warehouse."))] = 168,
) -> None:
    """Delete the rows of older topology versions from the versioned tables and run Delta VACUUM on them."""
    from rebalancer.operations import vacuum_warehouse

    if keep_versions < 1:  # before starting Spark
        raise typer.BadParameter(f"must be at least 1 (the newest version is what the next exchange starts from), "
                                 f"got {keep_versions}", param_hint="--keep-versions")
    state = _state(ctx)
    with step("vacuuming"):
        result = vacuum_warehouse(state.warehouse, keep_versions, retain_hours)
    if not result.kept:
        console.print("nothing committed yet: nothing to vacuum")
        return
    first, last = result.kept[0], result.kept[-1]
    sizes = ("" if result.bytes_before is None or result.bytes_after is None else
             f"; data files {result.bytes_before / 2**20:,.1f} MiB -> {result.bytes_after / 2**20:,.1f} MiB")
    console.print(f"kept {len(result.kept)} version(s), {first[0]}.{first[1]} to {last[0]}.{last[1]}; removed the "
                  f"rows of {result.removed} older version(s); VACUUM deleted {result.files_deleted} file(s) "
                  f"older than {retain_hours} h{sizes}")


@app.command()
def simulate(
    ctx: typer.Context,
    until_stable: Annotated[
        bool, typer.Option("--until-stable", help="Repeat rounds until the cluster is stable (or stuck).")
    ] = False,
    fail: Annotated[str | None, typer.Option("--fail", metavar="NODE", help="Fail this server mid-plan.")] = None,
    at_wave: Annotated[
        int | None, typer.Option("--at-wave", metavar="K", help="With --fail: after waves 1..K-1 have finished.")
    ] = None,
    max_rounds: Annotated[int, typer.Option(help="The most rounds --until-stable runs.")] = 20,
) -> None:
    """Execute the committed migration plan in a twin that writes the nodes' reports, running exchanges as due."""
    from rebalancer.twin.simulate import check_failure_options
    from rebalancer.twin.simulate import simulate as run_twin

    check_failure_options(fail, at_wave)
    state = _state(ctx)
    with step("running the twin"):
        result = run_twin(state.spark, state.warehouse, state.settings, until_stable=until_stable,
                          fail_node=fail, at_wave=at_wave, max_rounds=max_rounds, on_round=print_round)
    print_stability(result.stability)


@app.command("export-affinity")
def export_affinity_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="JSON file to write (rebalancer-routing-v1).")],
) -> None:
    """Write the latest committed client routing map as JSON for partition-aware clients."""
    from rebalancer.client.routing import RoutingMap
    from rebalancer.operations import export_affinity

    state = _state(ctx)
    document = export_affinity(state.warehouse)
    routing = RoutingMap.from_dict(document)  # validates before anything is written
    routing.save(out)
    major, minor = routing.version
    console.print(f"wrote the routing map of version {major}.{minor} ({len(routing.groups())} groups) to {out}")


@app.command()
def route(
    ctx: typer.Context,
    group: Annotated[str, typer.Option("--group", help="Cache group.")],
    keys: Annotated[list[str], typer.Argument(metavar="KEY...", help="Keys (strings; --int-keys for integers).")],
    int_keys: Annotated[bool, typer.Option("--int-keys", help="Treat keys as integers.")] = False,
) -> None:
    """Print the partition, primary and backups of each key, from the latest committed routing map."""
    from rebalancer.client.routing import RoutingMap
    from rebalancer.operations import export_affinity

    state = _state(ctx)
    routing = RoutingMap.from_dict(export_affinity(state.warehouse))
    major, minor = routing.version
    rows = []
    for raw in keys:
        key: Any = int(raw) if int_keys else raw
        nodes = routing.nodes(group, key)
        rows.append((raw, routing.partition(group, key), nodes[0] if nodes else None, ", ".join(nodes[1:])))
    console.print(f"version {major}.{minor}, group {group}")
    print_rows(["key", "partition", "primary", "backups"], rows, len(rows))


@app.command()
def demo(
    ctx: typer.Context,
    nodes: Annotated[int, typer.Option(help="Server nodes.")] = 12,
    groups: Annotated[int, typer.Option(help="Cache groups.")] = 4,
    partitions: Annotated[int, typer.Option(help="Partitions per group.")] = 256,
    backups: Annotated[int, typer.Option(help="Backups per partition.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed.")] = 42,
    report_dir: Annotated[
        Path, typer.Option("--report-dir", help="Where to write the report of the join's plan.")
    ] = Path("report"),
) -> None:
    """The main job, end to end on the embedded default: generate a cluster, fail a node, add one, plan and
    schedule the moves, run the twin until stable, and write a report."""
    from rebalancer.demo import run_demo

    state = _state(ctx)
    run_demo(state, nodes=nodes, groups=groups, partitions=partitions, backups=backups, seed=seed,
             report_dir=report_dir)


@app.command()
def report(
    ctx: typer.Context,
    version: Annotated[
        str | None,
        typer.Option("--version", metavar="MAJOR.MINOR", help="Committed version to report (default: the latest)."),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", help="Directory for the PNGs and report.html (created if missing).")
    ] = Path("report"),
) -> None:
    """Chart one committed version (placement, bytes moved, schedule, losses) as PNGs and one HTML page."""
    from rebalancer.report import collect_report_data, parse_version, write_report

    wanted = None if version is None else parse_version(version)  # before starting Spark: a typo costs no JVM
    state = _state(ctx)
    with step("collecting the report data"):
        data = collect_report_data(state.spark, state.warehouse, wanted, state.settings)
    with step("drawing the charts"):
        page = write_report(data, out)
    console.print(f"wrote the report of version {data.version_text} ({data.exchange.exchange_type}) to {page}")


@app.command()
def balance(
    ctx: typer.Context,
    version: Annotated[
        str | None,
        typer.Option("--version", metavar="MAJOR.MINOR", help="Committed version to evaluate (default: the latest)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole evaluation as JSON.")] = False,
    top: Annotated[int, typer.Option(help="Nodes listed: the most loaded ones, then the least loaded.")] = 10,
) -> None:
    """How even a committed placement is (replicas, primaries and bytes per node against capacity-weighted shares),
    and what the balanced affinity would move to even it."""
    import json

    from rebalancer.balance import evaluate
    from rebalancer.console import print_balance
    from rebalancer.report import parse_version

    wanted = None if version is None else parse_version(version)  # before starting Spark: a typo costs no JVM
    state = _state(ctx)
    with step("evaluating the balance"):
        result = evaluate(state.warehouse, wanted, spread=state.settings.affinity.balanced_spread)
    if as_json:
        console.print_json(json.dumps(result.as_dict()))
    else:
        print_balance(result, top)


kafka_app = typer.Typer(
    help="A live Apache Kafka cluster (docs/KAFKA.md): collect its state into the input tables, execute the "
         "committed plan on it, or loop collect -> exchange -> execute.",
    no_args_is_help=True,
)
app.add_typer(kafka_app, name="kafka")
_BOOTSTRAP_HELP = "Brokers to connect to, HOST:PORT[,HOST:PORT...] (default: [kafka] bootstrap)."


@kafka_app.command("collect")
def kafka_collect(
    ctx: typer.Context,
    bootstrap: Annotated[str | None, typer.Option("--bootstrap", help=_BOOTSTRAP_HELP)] = None,
) -> None:
    """Write what the cluster is into the input tables: brokers, topics, one report per replica, and the events
    since the last collect. A collect of an unchanged cluster writes nothing."""
    from rebalancer.kafka.drive import collect_cluster, snapshot_of

    state = _state(ctx)
    with step("reading the cluster"):
        snapshot = snapshot_of(state.settings, bootstrap)  # before Spark starts: an unreachable cluster fails fast
    with step("collecting the cluster"):
        result = collect_cluster(state.warehouse, state.settings, snapshot=snapshot)
    print_collect(result)


@kafka_app.command("execute")
def kafka_execute(
    ctx: typer.Context,
    bootstrap: Annotated[str | None, typer.Option("--bootstrap", help=_BOOTSTRAP_HELP)] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the reassignment JSON (the format "
                                          "kafka-reassign-partitions reads) and change nothing.")] = False,
) -> None:
    """Apply the newest committed plan: reassignments in the plan's order, at most [migration]
    max_parallel_per_node in flight on any broker, throttled when [kafka] throttle_bytes_per_s is set; the
    progress is collected back as reports. Killed and re-run, it resumes."""
    import json

    from rebalancer.kafka.drive import execute_plan, planned_moves

    state = _state(ctx)
    planned = planned_moves(state.warehouse)
    if dry_run:
        console.print(json.dumps(planned.as_reassignment_json(), indent=2), markup=False)
        return
    with step(f"executing {len(planned.moves)} moves of version {planned.version}"):
        result, collects = execute_plan(state.warehouse, state.settings, bootstrap, planned)
    print_execute(result, collects)


@kafka_app.command("run")
def kafka_run(
    ctx: typer.Context,
    bootstrap: Annotated[str | None, typer.Option("--bootstrap", help=_BOOTSTRAP_HELP)] = None,
    until_stable: Annotated[bool, typer.Option("--until-stable", help="Repeat until a round finds nothing to "
                                               "move (at most [kafka] until_stable_rounds rounds).")] = False,
) -> None:
    """collect -> exchange -> execute, once or until stable."""
    from rebalancer.kafka.drive import run

    state = _state(ctx)
    with step("driving the cluster"):
        run(state.spark, state.warehouse, state.settings, bootstrap, until_stable=until_stable,
            on_round=print_kafka_round)


ignite_app = typer.Typer(
    help="A live Apache Ignite 2.x cluster (docs/IGNITE.md): collect its nodes, cache groups, partition states, "
         "update counters and sizes into the input tables.",
    no_args_is_help=True,
)
app.add_typer(ignite_app, name="ignite")


@ignite_app.command("collect")
def ignite_collect(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option("--host", help="A server node's thin-client host (default: "
                                             "[ignite] host).")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Its thin-client port (default: [ignite] port, "
                                             "10800).")] = None,
) -> None:
    """Write what the cluster is into the input tables: nodes, cache groups, one report per copy (state, update
    counter, size), and the events since the last collect. A collect of an unchanged cluster writes nothing; a
    group the engine does not model is skipped with a rejected row."""
    from rebalancer.ignite.collect import collect, snapshot_of

    state = _state(ctx)
    with step("reading the cluster"):
        snapshot = snapshot_of(state.settings.ignite, host, port)  # before Spark starts: fails fast
    with step("collecting the cluster"):
        result = collect(state.warehouse, state.settings.ignite, host, port, snapshot=snapshot)
    print_ignite_collect(result)


@app.command()
def upgrade(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List each change per table; write nothing.")] = False,
) -> None:
    """Bring a warehouse written by an earlier release to this release's format (docs/STORAGE.md "Formats").

    Adds what later formats added, losing nothing: time travel still reaches every earlier version. Safe to run
    again, also after it was interrupted; a current warehouse is left alone.
    """
    from rebalancer.upgrade import describe
    from rebalancer.upgrade import upgrade as upgrade_warehouse

    state = _state(ctx)
    with step("planning the upgrade" if dry_run else "upgrading"):
        result = upgrade_warehouse(state.any_warehouse(), state.settings, dry_run=dry_run)
    for line in describe(result):
        console.print(line, markup=False)


def _log_to_stderr(on: bool) -> None:
    """With ``--verbose``, the engine's log lines (logger ``rebalancer``, INFO and up) on stderr with a time stamp;
    without, none (a process running several commands, like the tests, turns it off again)."""
    engine = logging.getLogger("rebalancer")
    ours = [h for h in engine.handlers if getattr(h, "_rebalancer_cli", False)]
    if on and not ours:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        handler._rebalancer_cli = True  # type: ignore[attr-defined]
        engine.addHandler(handler)
        engine.setLevel(logging.INFO)
    elif not on and ours:
        for h in ours:
            engine.removeHandler(h)
        engine.setLevel(logging.NOTSET)


@contextmanager
def _starting(label: str) -> Iterator[None]:
    """Spark's start under a spinner; then PySpark's query-context logs are left to ``--verbose``: PySpark logs
    every failed query as a JSON record with the JVM's whole stack trace on stderr before the error reaches us, and
    the one sentence already says what failed."""
    with step(label):
        yield
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = not _ERRORS.verbose


class _ErrorOptions:
    verbose = False


_ERRORS = _ErrorOptions()


def _root_cause(exc: BaseException) -> str | None:
    """For an error raised in the JVM (py4j's ``Py4JJavaError``): the innermost Java cause as ``Class: message``,
    the sentence a person can act on (its own first line is only "An error occurred while calling o123.save")."""
    java = getattr(exc, "java_exception", None)
    if java is None:
        return None
    try:
        cause = java
        while cause.getCause() is not None and not cause.getCause().equals(cause):
            cause = cause.getCause()
        message = cause.getMessage()
        name = cause.getClass().getSimpleName()
    except Exception:  # noqa: BLE001 - the JVM may be gone; fall back to the Python text
        return None
    return f"{name}: {message}" if message else str(name)


def _one_sentence(exc: BaseException) -> str:
    text = _root_cause(exc) or str(exc).strip() or type(exc).__name__
    first = text.splitlines()[0]
    # Spark errors carry a JVM stack trace after the first line; the first line is the sentence a person needs.
    return first if len(first) <= 400 else first[:400] + "..."


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``rebalancer`` script (typer reports usage errors itself; ours are one sentence)."""
    try:
        app(args=argv, prog_name="rebalancer")
    except SystemExit:
        raise
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("REBALANCER_DEBUG"):
            raise
        if _ERRORS.verbose:
            err_console.print(traceback.format_exc(), markup=False, soft_wrap=True)
        err_console.print(f"error: {_one_sentence(exc)}", markup=False, soft_wrap=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
