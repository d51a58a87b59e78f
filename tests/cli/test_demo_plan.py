"""The demo's plan in the words the database uses: failure classes and statuses, never its own scenario names."""

from __future__ import annotations

from flightrec.db.classify import load_rules

from flightrec.demo.system import FATE_ENDS_AS, FLEET_PLAN, fleet_summary, plan_fleet


def test_the_demo_announces_its_fleet_in_failure_classes():
    assert fleet_summary(plan_fleet(12)) == (
        "12 instances started, to end as: 1 below_min_rate, 1 cuda_out_of_memory, 1 daemon_crashed, "
        "1 destroyed (evidence incomplete), 1 gpu_arch_unsupported, 1 params_download_failed, 6 finished"
    )
    words = set(fleet_summary(plan_fleet(12)).replace(",", " ").split())
    assert not words & {"no_kernel_image", "cuda_oom", "params_download", "too_slow", "daemon_signal", "healthy"}


def test_every_fate_ends_as_a_shipped_class_or_a_status():
    classes = {r.failure_class for r in load_rules().rules}
    assert set(FATE_ENDS_AS) == set(FLEET_PLAN) | {"healthy"}
    for fate, ends in FATE_ENDS_AS.items():
        assert ends in classes or fate in ("destroyed", "healthy"), (fate, ends)
