"""The ``rebalancer`` command's entry point: the CLI, or a sentence naming the extra to install when only the core
(the Spark-free client) is installed."""

from __future__ import annotations

import sys

ENGINE_EXTRAS = ("pip install 'rebalancer[local]' (one machine: with pyspark and delta-spark) or "
                 "'rebalancer[cluster]' (on a Spark cluster that provides them)")


def main() -> int:
    """Run the CLI; without the engine's dependencies, say which extra brings them (exit status 2)."""
    try:
        from rebalancer.cli import main as cli_main
    except ModuleNotFoundError as exc:
        if (exc.name or "rebalancer").split(".")[0] == "rebalancer":
            raise  # our own module is missing: a broken install, not a missing extra
        print(f"rebalancer: the command needs the engine's dependencies ({exc.name} is missing): {ENGINE_EXTRAS}. "
              "Without them only the client library is installed (rebalancer.client).", file=sys.stderr)
        return 2
    cli_main()  # exits through SystemExit with the command's status
    return 0


if __name__ == "__main__":
    sys.exit(main())
