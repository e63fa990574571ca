"""Sections and levers a fleet has nothing to show for are left out, not shown as zeros.

A fleet without prefill/decode disaggregation got a KV-transfer section ("0 transfers"),
and a fleet whose router gains nothing a "+0.0 points" memory lever matched to it."""

from __future__ import annotations

import msgspec
import pytest
from kvscope.analytics.report import advice
from kvscope.analytics.report.layout import layout
from kvscope.analytics.report.markdown import render_markdown
from kvscope.analytics.report.model import LeverFigures, Report


def _text(report: Report) -> str:
    return render_markdown(report, layout(report, set()), "images")


@pytest.mark.parametrize("roles", [["both", "both"], ["both"], ["prefill", "decode"]])
def test_the_transfer_section_only_for_a_disaggregated_fleet(
    sample_report: Report, roles: list[str]
) -> None:
    fleet = sample_report.fleet
    pairs = zip(fleet.instances, roles, strict=False)
    instances = [msgspec.structs.replace(i, role=r) for i, r in pairs]
    empty = msgspec.structs.replace(sample_report.transfers, pairs=[], timeline=[], transfers=0)
    report = msgspec.structs.replace(
        sample_report,
        fleet=msgspec.structs.replace(fleet, instances=instances),
        transfers=empty,
    )
    sections = [s.anchor for s in layout(report, set())]
    assert ("transfers" in sections) == ("decode" in roles)
    assert "transfers" in [s.anchor for s in layout(sample_report, set())]


@pytest.mark.parametrize("router", [0.0, -0.03, 0.0004])
def test_no_memory_lever_matched_to_a_router_that_gains_nothing(
    sample_report: Report, router: float
) -> None:
    levers = LeverFigures(router, 0.05, 0.0, 0.002, "fixed", round_robin=-0.01)
    routing = msgspec.structs.replace(sample_report.routing, levers=levers)
    report = msgspec.structs.replace(sample_report, routing=routing)
    text = _text(report)
    assert "Memory alone" not in text
    assert "no router gain for memory to match" in text
    findings = advice.findings(
        report.fleet, report.instances, "", routing, report.transfers, report.params.min_transfers
    )
    assert not any("Routing or memory" in f for f in findings)


def test_a_router_gain_keeps_the_three_levers(sample_report: Report) -> None:
    text = _text(sample_report)
    assert "Memory alone" in text and "no router gain" not in text
