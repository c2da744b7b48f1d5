"""Rules on the source itself, checked by reading it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("plitzer", "planner")


def _sources() -> list[Path]:
    files = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
    assert len(files) > 20, f"found only {len(files)} modules under {PACKAGES} in {ROOT}"
    return files


def test_no_module_reads_a_call_frame() -> None:
    # The adapters refuse DataLoader's batching through the collate path, not by reading
    # the caller's frame (docs/torch.md, "A batch size is refused too").
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in _sources()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "_getframe" in line or "currentframe" in line
    ]
    assert found == []


def test_the_command_line_has_no_module_over_500_lines() -> None:
    # A subcommand is an entry of plitzer/cli/table.py, not a block of the parser.
    sizes = {p.name: len(p.read_text().splitlines()) for p in (ROOT / "plitzer" / "cli").glob("*.py")}
    assert "table.py" in sizes, sorted(sizes)
    assert {n: s for n, s in sizes.items() if s > 500} == {}
