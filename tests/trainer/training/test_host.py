"""The host record: the CPU model read from cpuinfo, with a fallback where there is none."""

from __future__ import annotations

from pathlib import Path

from allocator.trainer.training.host import cpu_model, host_info


def test_the_model_name_is_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n")
    assert cpu_model(cpuinfo) == "AMD EPYC 7B13"


def test_a_host_without_cpuinfo_still_names_something(tmp_path: Path) -> None:
    assert cpu_model(tmp_path / "absent") not in ("", None)


def test_host_info_reports_torch_as_configured() -> None:
    info = host_info()
    assert set(info) == {"cpu", "cpu_capability", "torch", "torch_threads"}
    assert isinstance(info["torch_threads"], int)
    assert info["torch_threads"] >= 1
