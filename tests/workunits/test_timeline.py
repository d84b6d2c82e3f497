"""The execution timeline picture (workunits.timeline), without a browser."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from xml.etree import ElementTree

from workunits import timeline

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NS = "{http://www.w3.org/2000/svg}"


def test_it_makes_one_band_per_history_row_lasting_until_the_next() -> None:
    rows = [(T0 + timedelta(seconds=30), "SCHEDULING"), (T0, "INITIALIZING"), (T0 + timedelta(seconds=90), "RUNNING")]
    bands = timeline.segments(rows, end=T0 + timedelta(seconds=150))
    assert [(b.state, b.duration.total_seconds()) for b in bands] == [
        ("INITIALIZING", 30), ("SCHEDULING", 60), ("RUNNING", 60)]



def test_it_draws_status_updates_within_a_state_as_one_band() -> None:
    rows = [(T0, "SCHEDULING"), (T0 + timedelta(seconds=10), "SCHEDULING"), (T0 + timedelta(seconds=20), "SCHEDULING"),
            (T0 + timedelta(seconds=30), "RUNNING"), (T0 + timedelta(seconds=35), "RUNNING")]
    bands = timeline.segments(rows, end=T0 + timedelta(seconds=60))
    assert [(b.state, b.duration.total_seconds()) for b in bands] == [("SCHEDULING", 30), ("RUNNING", 30)]

def test_it_draws_widths_in_proportion_and_caps_a_terminal_state() -> None:
    rows = [(T0, "SCHEDULING"), (T0 + timedelta(seconds=10), "RUNNING"), (T0 + timedelta(seconds=40), "FAILED")]
    svg = ElementTree.fromstring(timeline.svg(timeline.segments(rows, T0 + timedelta(seconds=40)), title="t"))
    rects = {g.get("data-state"): float(g.find(f"{NS}rect").get("width")) for g in svg.iter(f"{NS}g")}
    assert abs(rects["RUNNING"] / rects["SCHEDULING"] - 3.0) < 0.01
    assert rects["FAILED"] == timeline.CAP


def test_it_escapes_every_text_it_draws() -> None:
    out = timeline.svg(timeline.segments([(T0, "<script>")], T0 + timedelta(seconds=5)), title="a & <b>")
    assert "<script>" not in out and "&lt;script&gt;" in out and "a &amp; &lt;b&gt;" in out
    ElementTree.fromstring(out)  # well-formed


def test_it_says_so_when_there_is_no_history() -> None:
    assert "no status history" in timeline.svg([], title="empty")


def test_it_tells_a_pod_retry_and_a_requeue_apart() -> None:
    """RUNNING -> STARTING is the Job trying a failed pod again (quota held); SCHEDULING after a run is a re-queue."""
    at = [T0 + timedelta(seconds=10 * i) for i in range(8)]
    rows = [(at[0], "SCHEDULING"), (at[1], "STARTING"), (at[2], "RUNNING"), (at[3], "STARTING"), (at[4], "RUNNING"),
            (at[5], "SCHEDULING"), (at[6], "STARTING"), (at[7], "RUNNING")]
    bands = timeline.segments(rows, end=at[7] + timedelta(seconds=10))
    assert [b.label for b in bands] == [
        "SCHEDULING", "STARTING", "RUNNING", "STARTING (pod retry)", "RUNNING", "SCHEDULING (re-queued)",
        "STARTING", "RUNNING"]
    svg = timeline.svg(bands, title="t")
    assert svg.count('data-note="pod retry"') == 1 and svg.count('data-note="re-queued"') == 1
    ElementTree.fromstring(svg)


def test_it_says_every_band_in_words_in_the_legend_for_a_phone() -> None:
    rows = [(T0, "SCHEDULING"), (T0 + timedelta(seconds=10), "RUNNING"), (T0 + timedelta(seconds=70), "FAILED")]
    legend = timeline.legend(timeline.segments(rows, T0 + timedelta(seconds=70)))
    items = ElementTree.fromstring(legend).findall("li")
    assert ["".join(li.itertext()).split() for li in items] == [
        ["SCHEDULING", "10s", "12:00:00"], ["RUNNING", "1m00s", "12:00:10"], ["FAILED", "12:01:10"]]
