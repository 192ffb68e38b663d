"""Plausible student bugs, one per file: each mutates solutions/ and must fail a grader check.

A mutant file holds WHAT (the bug, in a student's words), CHAPTER ("01" … "08"), EDITS
(pairs of exact text in the chapter's solution and what the student wrote instead) and CHECKS
(the pytest -k expression of the fast checks that should catch it).
tests/book/test_exercise_mutants.py applies each one to a copy of solutions/ and grades it.

The slow_*.py files are performance mutants: correct but slow builds of a course milestone
(MILESTONE instead of CHECKS), which must pass their chapter's checks and fail the milestone's
performance bar (tests/tools/test_course.py).
"""
