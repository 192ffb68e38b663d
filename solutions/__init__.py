"""The book's exercises, one module per chapter (see exercises/README.md).

solutions/ holds the complete modules; exercises/ is generated from them by
scripts/make_exercises.py, with every marked solution region replaced by a NotImplementedError
stub. The tests in tests/exercises/ grade either one (MINICB_IMPL=solutions or exercises).
"""
