"""The Cost page rendered with Streamlit's AppTest against a real DuckDB file of known prices and failures."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest


def _metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_cost_page_shows_paid_lost_and_what_to_avoid(money_db, open_page):
    at = open_page(money_db, "cost")
    assert at.title[0].value == "Cost"
    assert _metric(at, "Paid") == "$10.30"  # 0.80 + 1.50 + 8.00
    assert _metric(at, "Lost before failures") == "$0.65"
    assert _metric(at, "Failed instances") == "2 of 3"
    assert [c.value for c in at.code] == ["gpu_name!=RTX_4090"]
    frames = [df.value for df in at.dataframe]
    avoid = next(f for f in frames if "offer_filter" in f.columns).set_index("offer_filter")
    assert set(avoid.index) == {"gpu_name!=RTX_4090", "driver_version!=570.86", "host_id!=123", "host_id!=456"}
    # the count, the interval and why, for what is banned and for what is not
    rtx, host = avoid.loc["gpu_name!=RTX_4090"], avoid.loc["host_id!=123"]
    assert (bool(rtx["banned"]), rtx["failed_instances"], rtx["instances"]) == (True, 2, 2)
    assert "gpu_arch_unsupported is deterministic for the gpu model" in rtx["why"]
    assert (bool(host["banned"]), host["failed_instances"], host["instances"]) == (False, 1, 1)
    assert (round(host["rate_low"], 3), host["rate_high"]) == (0.207, 1.0)
    assert "1 of 1 failed (95 % interval 21–100 %): too few to judge" in host["why"]
    assert any("One flaky failure bans nothing" in c.value for c in at.caption)
    by_class = next(f for f in frames if list(f.columns[:2]) == ["failure_class", "instances"])
    assert dict(zip(by_class["failure_class"], by_class["dollars_lost"].round(2), strict=True)) == {
        "gpu_arch_unsupported": 0.40,
        "cuda_out_of_memory": 0.25,
    }
    per_failure = next(f for f in frames if "dollars_before_failure" in f.columns)
    assert len(per_failure) == 3 and per_failure["open"].str.contains("failure=fb2").any()
    by_gpu = next(f for f in frames if "gpu_model" in f.columns and "failure_rate" in f.columns)
    assert by_gpu.set_index("gpu_model").loc["NVIDIA GeForce RTX 4090", "failed_instances"] == 2


def test_cost_page_without_instances_says_so(open_page, empty_db):
    at = open_page(empty_db, "cost")
    assert [i.value for i in at.info] == ["No instances yet."]


def test_sql_console_sees_the_money_views_too(money_db, open_page):
    """The console runs every shared view, not only the pages' ones, and lists them all in its help."""
    at = open_page(money_db, "sql")
    next(t for t in at.text_area).input("SELECT offer_filter FROM avoid_filter").run()
    assert not at.error, at.error[0].value
    assert list(at.dataframe[0].value["offer_filter"]) == ["gpu_name!=RTX_4090"]
    next(t for t in at.text_area).input("SELECT failure_id FROM failure_cost ORDER BY failure_id").run()
    assert list(at.dataframe[0].value["failure_id"]) == ["fa", "fb1", "fb2"]
    from flightrec.db.views import ALL_VIEW_NAMES

    listed = set(at.dataframe[-1].value["name"])
    assert set(ALL_VIEW_NAMES) <= listed, set(ALL_VIEW_NAMES) - listed


def test_cost_page_never_shows_the_lake_password(open_page):
    """The Cost page reads through the pages' one fetch, which masks a lake password in its error text."""
    from flightrec.broker.local import free_port

    db = f"ducklake:postgres:dbname=fleet host=127.0.0.1 port={free_port()} user=u password=hunter2"
    at = open_page(db, "cost")
    errors = [e.value for e in at.error]
    assert errors and all("hunter2" not in e and "password=***" in e for e in errors), errors
