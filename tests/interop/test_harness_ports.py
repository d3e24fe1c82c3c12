"""The port bands of the harness JVMs: two test workers never pick overlapping ports (pure; no JVM)."""

from __future__ import annotations

import pytest

from tests.interop.harness import PORT_HIGH, PORT_LOW, free_base, worker_ports


def test_each_worker_has_a_band_of_its_own_and_outside_xdist_the_whole_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert worker_ports() == range(PORT_LOW, PORT_HIGH)
    for count in (2, 3, 4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
        bands = []
        for w in range(count):
            monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{w}")
            bands.append(set(worker_ports()))
        assert all(not (a & b) for i, a in enumerate(bands) for b in bands[i + 1:]), count
        assert all(len(band) >= 3 * 120 for band in bands), "room for three clusters of the live tests' span"


def test_free_base_stays_in_the_workers_band(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    for w in range(2):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{w}")
        band = worker_ports()
        for span in (80, 120):
            base = free_base(span)
            assert band.start <= base and base + span <= band.stop, (w, span, base)
