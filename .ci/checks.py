"""Release checks for .ci/run (standard library only).

python .ci/checks.py wheel DIST/plitzer-X-py3-none-any.whl
    The wheel holds the packages planner and plitzer (with their py.typed markers),
    the licences and its metadata, nothing else; prints its size and file list.
python .ci/checks.py junit REPORT.xml [--same-as OTHER.xml] [--tests N] [--slowest N]
    A pytest run really ran tests: some passed, none failed or errored; with
    --same-as, it ran exactly as many tests as the other run (nothing went missing).
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path


def check_wheel(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as z:
        names = sorted(z.namelist())
    dist_info = next((n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")), "")
    bad = []
    for n in names:
        top = n.split("/")[0]
        if top in ("planner", "plitzer"):
            if not (n.endswith((".py", "/py.typed"))):
                bad.append(f"unexpected file in a package: {n}")
        elif top != dist_info:
            bad.append(f"outside planner/, plitzer/ and {dist_info or '*.dist-info'}/: {n}")
    need = [
        "planner/__init__.py",
        "planner/py.typed",
        "plitzer/__init__.py",
        "plitzer/py.typed",
        "plitzer/torch.py",
        "plitzer/grain.py",
        "plitzer/bench/__init__.py",
        f"{dist_info}/licenses/LICENSE-MIT",
        f"{dist_info}/licenses/LICENSE-APACHE",
        f"{dist_info}/METADATA",
        f"{dist_info}/entry_points.txt",
    ]
    bad += [f"missing: {n}" for n in need if n not in names]
    size = path.stat().st_size
    print(f"{path.name}: {size:,} bytes, {len(names)} files")
    for n in names:
        print(f"  {n}")
    return bad


def _counts(path: Path) -> dict[str, int]:
    root = ET.parse(path).getroot()  # noqa: S314 (our own pytest's report)
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    keys = ("tests", "failures", "errors", "skipped")
    return {k: sum(int(s.get(k, 0)) for s in suites) for k in keys}


def slowest(path: Path, n: int) -> None:
    """Print the ``n`` longest tests of the report (where CI's minutes go), with their share of the run."""
    root = ET.parse(path).getroot()  # noqa: S314 (our own pytest's report)
    cases = [(float(c.get("time", 0)), f"{c.get('classname', '')}::{c.get('name', '')}") for c in root.iter("testcase")]
    total = sum(t for t, _ in cases) or 1.0
    print(f"{path.name}: {total:.0f} s of tests in all; the {n} longest:")
    for t, name in sorted(cases, reverse=True)[:n]:
        print(f"  {t:7.1f} s  {100 * t / total:4.1f} %  {name}")


def check_junit(path: Path, same_as: Path | None, tests: int | None = None) -> list[str]:
    c = _counts(path)
    passed = c["tests"] - c["failures"] - c["errors"] - c["skipped"]
    print(
        f"{path.name}: {c['tests']} tests, {passed} passed, {c['skipped']} skipped, "
        f"{c['failures']} failed, {c['errors']} errors"
    )
    bad = []
    if passed < 1:
        bad.append(f"{path.name}: no test passed")
    if c["failures"] or c["errors"]:
        bad.append(f"{path.name}: {c['failures']} failed, {c['errors']} errors")
    if same_as is not None:
        other = _counts(same_as)["tests"]
        if other != c["tests"]:
            bad.append(f"{path.name} ran {c['tests']} tests, {same_as.name} ran {other}")
    if tests is not None and tests != c["tests"]:
        bad.append(f"{path.name} ran {c['tests']} tests, the checkout collects {tests} for the same selection")
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="what", required=True)
    w = sub.add_parser("wheel")
    w.add_argument("wheel", type=Path)
    j = sub.add_parser("junit")
    j.add_argument("report", type=Path)
    j.add_argument("--same-as", type=Path, default=None)
    j.add_argument("--tests", type=int, default=None, help="the number of tests the run must have run")
    j.add_argument("--slowest", type=int, default=0, help="print this many of the longest tests")
    args = p.parse_args(argv)
    if args.what == "junit" and args.slowest:
        slowest(args.report, args.slowest)
    bad = check_wheel(args.wheel) if args.what == "wheel" else check_junit(args.report, args.same_as, args.tests)
    for b in bad:
        print(f"FAIL {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
