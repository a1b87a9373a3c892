"""The demo's paper-trading leg on the tiny model and the embedded data: it trades every bar of
the span and prints the live NAV beside the backtest's, within 0.1%."""

from __future__ import annotations

from pathlib import Path

from allocator.trading.demo import paper_trade_demo
from tests.serving.conftest import write_tiny_model


def test_the_demo_paper_trades_the_span_and_prints_both_navs(tmp_path: Path) -> None:
    from allocator.trainer.market.data import load_sp500

    md = load_sp500()
    registry = tmp_path / "models"
    write_tiny_model(registry / "tiny" / "1")
    dates = [d.date() for d in md.dates]
    lines: list[str] = []
    report = paper_trade_demo(
        registry, tmp_path, dates, md.prices, md.assets, dates[-40], dates[-1], echo=lines.append
    )
    assert report.bars == 40
    assert abs(report.tracking_difference) < 1e-3
    text = "\n".join(lines)
    assert "paper trading tiny/1 on 40 validation bars" in text
    assert "live NAV" in text
    assert "backtest NAV" in text
    again = paper_trade_demo(  # a rerun of the demo starts afresh
        registry, tmp_path, dates, md.prices, md.assets, dates[-5], dates[-1], echo=lines.append
    )
    assert again.bars == 5
