"""The Delta Lake jars for the delta-spark engine: fetched once from Maven Central, kept beside the environment.

Contract:
- :data:`DELTA_ARTIFACT` is the Maven artifact that matches the pinned ``delta-spark`` Python package and pyspark
  4.2 (``delta-spark_2.13`` 4.4.0 is built against Spark 4.2.0; Delta also publishes ``delta-spark_4.1_2.13`` and
  ``delta-spark_4.2_2.13``). Measured 2026-11-24: Maven Central serves 4.4.0 (4.4.1, the newest Python package, has
  no jar there), so the Python package is pinned to 4.4.0.
- :func:`fetch` resolves it with Maven (``mvn dependency:copy-dependencies``, the local repository under the
  environment) and keeps the jars pyspark does not already ship (Delta's own, Unity Catalog's client and a few small
  libraries), in :data:`JARS_DIR`. Nothing is committed or vendored; a machine without Maven or without Maven Central
  gets a one-sentence reason and the delta-rs engine.
- :func:`jars` lists what :func:`fetch` kept (empty before it ran); :func:`session_conf` is the Spark configuration
  that puts them, the Delta SQL extension and the Delta catalog into a new session.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["DELTA_ARTIFACT", "DELTA_VERSION", "JARS_DIR", "fetch", "jars", "session_conf"]

DELTA_VERSION = "4.4.0"
DELTA_ARTIFACT = ("io.delta", "delta-spark_2.13", DELTA_VERSION)
JARS_DIR = Path(sys.prefix) / "rebalancer-delta-jars"
_MAVEN_REPO = Path(sys.prefix) / "rebalancer-m2"
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>rebalancer</groupId><artifactId>delta-jars</artifactId><version>1</version>
<dependencies><dependency><groupId>{0}</groupId><artifactId>{1}</artifactId><version>{2}</version></dependency>
</dependencies></project>
"""
_VERSIONED = re.compile(r"^(?P<name>.+?)-\d[\w.\-]*\.jar$")


def jars() -> list[Path]:
    """The jars :func:`fetch` kept, sorted; empty when it has not run (or failed)."""
    return sorted(JARS_DIR.glob("*.jar")) if JARS_DIR.is_dir() else []


def session_conf() -> dict[str, str]:
    """Spark settings for a new local session with Delta: the jars, the SQL extension, the catalog (empty: none)."""
    found = jars()
    if not found:
        return {}
    return {
        "spark.jars": ",".join(str(j) for j in found),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # Delta rebuilds a table's state (its log replay) in 50 shuffle partitions by default: on a laptop's
        # small tables that is most of every read and write (a 4-node exchange: 87 s -> 22 s with 1).
        "spark.databricks.delta.snapshotPartitions": "1",
    }


def _pyspark_jar_names() -> set[str]:
    import pyspark

    shipped = Path(pyspark.__file__).parent / "jars"
    return {m.group("name") for j in shipped.glob("*.jar") if (m := _VERSIONED.match(j.name))}


def fetch(timeout_s: float = 600) -> str | None:
    """Fetch :data:`DELTA_ARTIFACT` into :data:`JARS_DIR` (replacing what was there).

    Returns:
        None when the jars are in place, else the one sentence that says why not (no ``mvn``, Maven failed).
    """
    mvn = shutil.which("mvn")
    if mvn is None:
        return "mvn not found on the PATH: the delta-spark engine needs the Delta jars from Maven Central"
    with tempfile.TemporaryDirectory(prefix="rebalancer-delta-jars-") as tmp:
        work = Path(tmp)
        (work / "pom.xml").write_text(_POM.format(*DELTA_ARTIFACT))
        out = work / "jars"
        command = [mvn, "-q", "-B", f"-Dmaven.repo.local={_MAVEN_REPO}", "dependency:copy-dependencies",
                   "-DincludeScope=runtime", f"-DoutputDirectory={out}"]
        try:
            done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"Maven did not fetch {':'.join(DELTA_ARTIFACT)} within {timeout_s:.0f} s"
        if done.returncode != 0:
            lines = [x for x in (done.stdout + done.stderr).splitlines() if "ERROR" in x] or ["no output"]
            return f"Maven could not fetch {':'.join(DELTA_ARTIFACT)}: {lines[0].strip()}"
        shipped = _pyspark_jar_names()
        keep = [j for j in out.glob("*.jar") if (m := _VERSIONED.match(j.name)) and m.group("name") not in shipped]
        shutil.rmtree(JARS_DIR, ignore_errors=True)
        JARS_DIR.mkdir(parents=True)
        for j in keep:
            shutil.move(str(j), JARS_DIR / j.name)
    return None


if __name__ == "__main__":
    reason = fetch()
    if reason:
        print(f"rebalancer: {reason}; the delta-rs engine is used", file=sys.stderr)
    else:
        print(f"rebalancer: {len(jars())} Delta jars in {JARS_DIR}", file=sys.stderr)
