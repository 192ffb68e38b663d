"""Grade one milestone of the course track: correctness, then the accuracy gate, then the bars.

What a student sees (`make grade MILESTONE=2`): the chapters' scorecards, then the milestone's
three layers, each bar with the student's value, the reference's, their ratio with its spread
and the verdict. What an instructor gets: Gradescope tests (correctness and performance as
separate tests), a CSV row per submission, and the student's report with its measured table
filled in (course/reports/milestone-N.md).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

from minicb.tools.course import (
    MILESTONES,
    REFERENCE,
    ROOT,
    BarResult,
    Milestone,
    measure_bar,
    not_measured,
)
from minicb.tools.course_accuracy import GateResult, accuracy_gate
from minicb.tools.grade import Check, run_checks, scorecard, submission

REPORTS = ROOT / "course" / "reports"
TABLE_MARK = "<!-- the grader fills in the measured table here -->"


@dataclass
class MilestoneGrade:
    milestone: Milestone
    checks: list[Check]
    gate: GateResult | None = None
    gate_reason: str = ""              # why the gate did not run, when it did not
    bars: list[BarResult] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)   # each layer's grading time

    @property
    def correct(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)


def chapters_of(number: str) -> tuple[str, ...]:
    return MILESTONES[number].chapters


def grade_milestone(folder: Path, number: str, checks: list[Check],
                    reference: Path = REFERENCE) -> MilestoneGrade:
    """The accuracy gate and the bars of milestone `number`, given its correctness `checks`:
    each layer runs only when the one before it passed."""
    milestone = MILESTONES[number]
    grade = MilestoneGrade(milestone, checks)
    if not grade.correct:
        failing = sum(not c.passed for c in checks)
        grade.gate_reason = f"not run: correctness first ({failing} checks fail)"
        grade.bars = not_measured(milestone, f"not measured: correctness first ({failing} "
                                  "checks fail)")
        return grade
    started = time.monotonic()
    grade.gate = accuracy_gate(folder, reference, milestone.parts, milestone.engine)
    grade.seconds["accuracy"] = time.monotonic() - started
    if not grade.gate.passed:
        grade.bars = not_measured(milestone, "not measured: the accuracy gate failed")
        return grade
    started = time.monotonic()
    grade.bars = [measure_bar(bar, folder, reference) for bar in milestone.bars]
    grade.seconds["performance"] = time.monotonic() - started
    return grade


def _value(values: list[float], unit: str) -> str:
    """The median of one side's runs, with its unit ("-" when nothing was measured)."""
    if not values:
        return "-"
    middle = sorted(values)[len(values) // 2]
    return (f"{middle:.0f}" if middle >= 100 else f"{middle:.3g}") + f" {unit}"


def measured_rows(grade: MilestoneGrade) -> list[list[str]]:
    """One row per bar: bar, yours, reference, ratio (spread), full/partial bars, verdict."""
    return [[r.bar.name, _value(r.yours, r.bar.unit), _value(r.reference, r.bar.unit),
             r.ratio_text(), f"{r.bar.full:g}", f"{r.bar.partial:g}",
             r.verdict + (f" ({r.points:g}/{r.bar.points:g})" if r.ratios else "")]
            for r in grade.bars]


HEADER = ["bar", "yours", "reference", "ratio (spread)", "full", "partial", "verdict (points)"]


def machine() -> str:
    """Where the bars were timed: the ratios hold anywhere, their spread depends on this."""
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{platform.machine()} {os.cpu_count()} CPU cores, load average {load} (1, 5, 15 min)"


def milestone_card(grade: MilestoneGrade) -> str:
    m = grade.milestone
    passed = sum(c.passed for c in grade.checks)
    gate = (f"{'ok' if grade.gate.passed else 'FAIL'}: {grade.gate.summary}" if grade.gate
            else grade.gate_reason)
    rows = [HEADER] + measured_rows(grade)
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = [f"milestone {m.number}: {m.title} (ch{', ch'.join(m.chapters)})",
             f"  built        {m.builds}", f"  run          {m.runs}",
             f"  correctness  {passed}/{len(grade.checks)} checks passed",
             f"  accuracy     {gate}",
             "  performance  ratio = the reference's value / yours for a time, yours / the "
             "reference's for a count: 1.0 is the reference's speed",
             f"               timed on {machine()}"]
    lines += ["    " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
              for row in rows]
    lines += [f"    {r.bar.name}: {r.reason}" for r in grade.bars if r.reason and r.ratios]
    if grade.bars and not grade.bars[0].ratios:
        lines.append(f"    {grade.bars[0].reason}")
    score, most = performance_points(grade)
    lines.append(f"  score        correctness {passed}/{len(grade.checks)}, performance "
                 f"{score:g}/{most:g}"
                 + "".join(f", {layer} took {s:.0f} s" for layer, s in grade.seconds.items()))
    return "\n".join(lines)


def performance_points(grade: MilestoneGrade) -> tuple[float, float]:
    return sum(r.points for r in grade.bars), sum(b.points for b in grade.milestone.bars)


def gradescope_tests(grade: MilestoneGrade) -> list[dict]:
    """The gate and one test per bar; correctness is the chapters' checks (grade.gradescope)."""
    m = grade.milestone
    tests = [{"name": f"milestone {m.number} accuracy gate", "max_score": 1.0,
              "score": float(bool(grade.gate and grade.gate.passed)),
              "output": grade.gate.summary if grade.gate else grade.gate_reason}]
    for r in grade.bars:
        output = (f"{r.bar.metric} on {r.bar.workload}: yours {_value(r.yours, r.bar.unit)}, "
                  f"the reference {_value(r.reference, r.bar.unit)}; ratio {r.ratio_text()}; "
                  f"full credit from {r.bar.full:g}, half from {r.bar.partial:g}: {r.verdict}. "
                  f"{r.reason}").strip()
        tests.append({"name": f"milestone {m.number} performance: {r.bar.name}",
                      "score": r.points, "max_score": r.bar.points, "output": output})
    return tests


def csv_header(number: str) -> list[str]:
    return ["accuracy"] + [f"{b.name} {what}" for b in MILESTONES[number].bars
                           for what in ("ratio", "verdict")] + ["performance points"]


def csv_row(grade: MilestoneGrade) -> list[str]:
    gate = "pass" if grade.gate and grade.gate.passed else "fail" if grade.gate else "not run"
    cells = [gate]
    for r in grade.bars:
        cells += [r.ratio_text(), r.verdict]
    return cells + [f"{performance_points(grade)[0]:g}"]


def filled_report(grade: MilestoneGrade) -> str:
    """The milestone's report template with the measured table in place of its mark."""
    template = (REPORTS / f"milestone-{grade.milestone.number}.md").read_text()
    rows = [HEADER, ["---"] * len(HEADER)] + measured_rows(grade)
    table = "\n".join("| " + " | ".join(row) + " |" for row in rows)
    gate = grade.gate.summary if grade.gate else grade.gate_reason
    passed = sum(c.passed for c in grade.checks)
    measured = (f"Correctness: {passed}/{len(grade.checks)} checks passed. Accuracy gate: "
                f"{gate}. Timed on {machine()}.\n\n{table}")
    return template.replace(TABLE_MARK, measured)


def main(path: Path, number: str, verbose: bool, json_out: Path | None,
         report: Path | None) -> int:
    from minicb.tools.grade import gradescope
    with submission(path) as folder:
        started = time.monotonic()
        checks, _ = run_checks(folder, list(chapters_of(number)))
        correctness_s = time.monotonic() - started
        print(scorecard(checks, verbose=verbose, folder=folder))
        grade = grade_milestone(folder, number, checks)
    grade.seconds = {"correctness": correctness_s, **grade.seconds}
    print(milestone_card(grade))
    if json_out:
        json_out.write_text(json.dumps(gradescope(checks, gradescope_tests(grade)), indent=2)
                            + "\n")
        print(f"wrote {json_out}")
    if report:
        report.write_text(filled_report(grade))
        print(f"wrote {report}")
    full = all(r.verdict == "full" for r in grade.bars)
    return 0 if grade.correct and grade.gate and grade.gate.passed and full else 1
